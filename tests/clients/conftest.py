"""Full-stack fixtures shared with tests/codemode."""

from tests.codemode.conftest import make_registry, make_stack, stack

__all__ = ["make_registry", "make_stack", "stack"]
