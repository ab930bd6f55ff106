"""Fixtures for the whole suite.

The testing kit's `codemode_services` (clients/python/codemode_client/testing/plugin.py) lives
for a whole session, as a user's suite wants. Here it lives for one module: its `codemode up`
is a child of the test process, and the runtime's tests assert that no process of theirs
outlives them (a session-long one would read as a leak in every test after the first module
that used it).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from codemode_client.testing.plugin import running_services
from codemode_client.testing.services import CodemodeServices


@pytest.fixture(scope="module")
def codemode_services(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[CodemodeServices]:
    yield from running_services(tmp_path_factory, pytestconfig)


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C works in the children the tests start, as at a terminal. A suite started in the
    background by a shell without job control inherits SIGINT ignored, and every child it
    starts would inherit that too: the tests that stop a command with SIGINT would see it run
    on. A handled signal is reset to the default at exec, an ignored one is not, so handling
    it here gives each child the default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
