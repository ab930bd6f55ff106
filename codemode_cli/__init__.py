"""The `codemode` command line: run the services locally and show what they do."""
