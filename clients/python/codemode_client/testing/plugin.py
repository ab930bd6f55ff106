"""The pytest plugin of `codemode_client.testing` (entry point `pytest11`: `codemode`).

Fixtures:
- `codemode_services` (session): a registry and a runtime started by `codemode up` on free
  loopback ports, history and traces in a temporary folder; stopped by pid at the session's end.
- `codemode` (function, async): a `Testbed` on those services; its agents and providers are
  removed after the test.

`--codemode-command` (or `$CODEMODE_TESTING_COMMAND`) names the `codemode` command to start the
services with. Async fixtures need pytest-asyncio (the `testing` extra installs it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from codemode_client.testing.services import CodemodeServices, start_services
from codemode_client.testing.testbed import Testbed

try:
    import pytest_asyncio
except ImportError:  # the servers' package registers this plugin too, without pytest-asyncio
    pytest_asyncio = None  # type: ignore[assignment]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--codemode-command",
        default=None,
        help="the command that runs `codemode` for the testing kit's services "
        "(default: $CODEMODE_TESTING_COMMAND, this interpreter's codemode_cli, or `codemode`)",
    )


def running_services(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[CodemodeServices]:
    """The services of `codemode_services`, started now and stopped when the generator is
    closed (for a suite that overrides the fixture with another scope)."""
    command = pytestconfig.getoption("--codemode-command")
    services = start_services(tmp_path_factory.mktemp("codemode"), command=command)
    try:
        yield services
    finally:
        services.stop()


@pytest.fixture(scope="session")
def codemode_services(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[CodemodeServices]:
    yield from running_services(tmp_path_factory, pytestconfig)


async def _testbed(codemode_services: CodemodeServices) -> AsyncIterator[Testbed]:
    async with Testbed(codemode_services.address) as testbed:
        yield testbed


if pytest_asyncio is not None:
    codemode = pytest_asyncio.fixture(_testbed, name="codemode")
else:

    @pytest.fixture(name="codemode")
    def _no_asyncio() -> None:
        raise pytest.UsageError(
            "the `codemode` fixture is async: install pytest-asyncio "
            '(pip install "codemode-client[testing]")'
        )
