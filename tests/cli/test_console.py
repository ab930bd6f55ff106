"""`codemode console` as a real process: refusals at start, and the end of its registry.

The page itself (approvals, Client halves, the panel, trajectories) is tested in headless
Chromium by the console package's own test (`npm test --prefix console`, run by scripts/test).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from codemode_cli.exit_codes import ExitCode
from tests.cli._processes import CLI, cli, free_port, listening_port, service_env, spawn, stop
from tests.typescript_build import built_console


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    built_console()  # not inside the commands' bounds (tests/typescript_build.py)
    proc, lines = spawn(
        [*CLI, "registry", "--listen", "127.0.0.1:0"],
        service_env(tmp_path),
        tmp_path,
        tmp_path / "registry.err",
    )
    line = lines.expect(lambda s: s.startswith("registry listening on port "), timeout=60)
    yield proc, f"127.0.0.1:{listening_port(line)}"
    stop(proc)


def test_an_unknown_agent_is_refused(
    registry: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    _, address = registry
    out = cli(
        "console",
        "--registry",
        address,
        "--agent",
        "ghost",
        env=service_env(tmp_path),
        cwd=tmp_path,
    )
    assert out.returncode == ExitCode.NOT_FOUND, out.stderr
    assert "console:" in out.stderr and "agents/ghost does not exist" in out.stderr


def test_a_registry_that_is_down_is_told_in_our_words(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    env = service_env(tmp_path)
    out = cli("console", "--registry", address, "--agent", "ops", env=env, cwd=tmp_path)
    assert out.returncode == ExitCode.UNAVAILABLE, out.stderr
    assert out.stderr.splitlines()[-1] == (
        f"codemode console: cannot reach the registry at {address} (UNAVAILABLE)"
    )
    assert "No connection established" not in out.stderr  # grpc-js's own text
    assert "console listening" not in out.stdout


def test_the_console_serves_until_its_registry_goes_away(
    registry: tuple[subprocess.Popen[str], str], tmp_path: Path
) -> None:
    registry_proc, address = registry
    argv = [*CLI, "console", "--registry", address, "--agent", "ops", "--create-agent"]
    proc, lines = spawn(argv, service_env(tmp_path), tmp_path, tmp_path / "console.err")
    try:
        line = lines.expect(lambda s: s.startswith("console listening on port "), timeout=120)
        port = listening_port(line)
        opened = lines.expect(lambda s: s.startswith("console: open "))
        assert f"http://127.0.0.1:{port}/" in opened and "agents/ops" in opened
        assert stop(registry_proc) == 0
        status = proc.wait(60)
    finally:
        stop(proc)
    assert status == 1
    assert "the page-runner stream to" in (tmp_path / "console.err").read_text()


@pytest.mark.parametrize(
    ("extra", "wording"),
    [
        (["--bind", "0.0.0.0"], "--bind 0.0.0.0: name one IP address, not a wildcard"),
        (["--bind", "example.com"], "--bind example.com: name one IP address"),
        (["--token-file", "missing.token"], "--token-file: cannot read missing.token"),
        (["--token-file", "two.token"], "--token-file: two.token must hold one token"),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
    ],
)
def test_bad_page_or_credential_options_are_refused_before_anything_serves(
    tmp_path: Path, extra: list[str], wording: str
) -> None:
    (tmp_path / "two.token").write_text("one two\n")
    out = cli(
        "console",
        "--registry",
        "127.0.0.1:1",
        "--agent",
        "ops",
        *extra,
        env=service_env(tmp_path),
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert wording in out.stderr
    assert "console listening" not in out.stdout
