"""The TypeScript client's build (clients/typescript/dist), made once per test run and shared.

`npm run build` deletes dist/ and compiles it again (~15 s of CPU). Two tests pack the client
(tests/clients/test_npm_package.py, tests/examples/test_examples.py); in two pytest-xdist
workers their `prepack` builds would run at once in the one dist/, one deleting what the other
was compiling or packing. So the build is made under a file lock every worker shares, and once
per run: the lock file records the run that built last (pytest-xdist's `testrunuid`, the same
in every worker of one run; a fresh id per serial session). The tests then pack with
`--ignore-scripts`: what they pack is this run's build, and test_npm_package.py asserts that
`prepack` is that build.
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "clients" / "typescript"
_LOCK = PACKAGE / "node_modules" / ".codemode-tests-build"
_LOCK_WAIT_S = 900  # another worker's build: bounded by its own npm timeout below
_BUILD_TIMEOUT_S = 600  # tsc over the client: ~15 s of CPU, far longer on a loaded host
_RUN = pytest.StashKey[str]()


def _run_id(config: pytest.Config) -> str:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return str(workerinput["testrunuid"])
    if _RUN not in config.stash:
        config.stash[_RUN] = uuid.uuid4().hex
    return config.stash[_RUN]


@contextlib.contextmanager
def _locked() -> Iterator[TextIO]:
    """The build lock every worker of every run shares (the lock file, open, for its stamp)."""
    with _LOCK.open("a+") as lock:
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{_LOCK} still locked after {_LOCK_WAIT_S} s (a stuck build?)")
                time.sleep(0.2)
        yield lock


def built_client(config: pytest.Config) -> Path:
    """The client package with dist/ built by this run (built now unless a worker of the run
    already did); the package's directory."""
    run = _run_id(config)
    with _locked() as lock:
        lock.seek(0)
        if lock.read() != run or not (PACKAGE / "dist" / "src" / "index.js").exists():
            done = subprocess.run(
                ["npm", "run", "--silent", "build"],
                capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, cwd=PACKAGE, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            lock.seek(0)
            lock.truncate()
            lock.write(run)
            lock.flush()
    return PACKAGE


def built_console() -> None:
    """The console built when stale (codemode_cli.console_command.ensure_built, which builds
    the client's dist/ first), under the same lock, before a test starts a console: so the
    build does not delete the client's dist/ under another worker's pack, and the start bound
    of `codemode up --console` (60 s, codemode_cli/up.py) does not cover a build (~30 s of
    CPU, minutes on a loaded host)."""
    from codemode_cli.console_command import ensure_built

    with _locked():
        problem = ensure_built()
    assert not problem, problem
