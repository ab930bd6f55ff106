"""The TypeScript worker as its launcher sees it: Node, exec'd by ``exec_launch.py`` once the
worker is isolated (its command line: ``runtime_service/languages/typescript.py``).

Node's exit when V8 reaches its heap limit needs telling apart from a crash: it writes
``HEAP_EXHAUSTED`` to its stderr and aborts. The TypeScript backend's ``ExitSigns`` name it.

Stdlib only.
"""

from __future__ import annotations

__all__ = ["HEAP_EXHAUSTED"]

HEAP_EXHAUSTED = "JavaScript heap out of memory"
"""What Node writes to its stderr (fd 2, the runtime's pipe) when V8 reaches its heap limit,
just before it aborts (SIGABRT). Node offers no hook to exit otherwise, so this line and the
abort are how the runtime tells an exhausted memory budget from a crash. A program that
forged it would only misname its own run's end."""
