"""`codemode mcp serve` started without stdin or stdout: a usage error (status 2) with one clear
line, never a traceback, and never a file that happened to take the free descriptor served as
the wire. No registry is needed: the check comes before anything is opened or dialled."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.mcp_serve.conftest import CLI

SERVE = [*CLI, "mcp", "serve", "--registry", "127.0.0.1:9", "--agent", "agents/closed"]


def _serve_without(fds: tuple[int, ...]) -> subprocess.CompletedProcess[bytes]:
    def close() -> None:
        for fd in fds:
            os.close(fd)

    # The stdio the test keeps are pipes; the closed ones are closed in the child only.
    return subprocess.run(
        SERVE,
        stdin=subprocess.PIPE,
        capture_output=True,
        preexec_fn=close,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("fds", "named"),
    [((0,), "stdin not open"), ((1,), "stdout not open"), ((0, 1), "stdin and stdout not open")],
)
def test_a_closed_stdio_is_a_usage_error(fds: tuple[int, ...], named: str) -> None:
    done = _serve_without(fds)
    assert done.returncode == 2
    err = done.stderr.decode()
    assert named in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_with_stderr_closed_too_it_still_exits_2() -> None:
    done = _serve_without((0, 1, 2))
    assert done.returncode == 2


def test_http_transport_does_not_need_stdio() -> None:
    """Only stdio serves on stdin/stdout: an http server's problem is its own (here the
    registry that does not answer), not the closed descriptors."""
    done = subprocess.run(
        [*SERVE, "--transport", "http", "--listen", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        preexec_fn=lambda: os.close(0),
        timeout=120,
        check=False,
    )
    assert "not open" not in done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()
