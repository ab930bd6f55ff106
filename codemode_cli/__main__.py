"""`python -m codemode_cli ...` (installed as `codemode`)."""

from codemode_cli.main import main

raise SystemExit(main())
