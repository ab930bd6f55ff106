"""The `codemode` command as a process: version, log level, environment check, Ctrl-C, a closed
stdout, a taken port and the trace file's hints, each driven as a real child process."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from codemode_cli.exit_codes import ExitCode
from tests.cli._processes import (
    CLI,
    cli,
    kill_tree,
    listening_port,
    piped_to_head,
    service_env,
    spawn,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="signals and /proc")


def _unchecked(tmp: Path, **extra: str) -> dict[str, str]:
    """service_env without the mark of a parent that checked the variables already (a test
    that ran `main()` in this process leaves it in os.environ)."""
    env = {**service_env(tmp), **extra}
    env.pop("CODEMODE_ENV_CHECKED", None)
    return env


def _wait(proc: subprocess.Popen[str], timeout: float = 60) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise


def _interrupt(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    return _wait(proc)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_version_is_the_package_metadata_version(tmp_path: Path) -> None:
    done = cli("--version", env=service_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"codemode {importlib.metadata.version('codemode')}"


def test_an_unknown_codemode_variable_is_warned_about_once_naming_the_closest(
    tmp_path: Path,
) -> None:
    env = _unchecked(tmp_path, CODEMODE_REGISTRY_HISTORY_PTH="x", CODEMODE_LOG_LEVL="1")
    done = cli("trace", "c", "--file", str(tmp_path / "none.jsonl"), env=env, cwd=tmp_path)
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "codemode: warning: unknown environment variable CODEMODE_LOG_LEVL is ignored; "
        "did you mean CODEMODE_LOG_LEVEL?",
        "codemode: warning: unknown environment variable CODEMODE_REGISTRY_HISTORY_PTH is "
        "ignored; did you mean CODEMODE_REGISTRY_HISTORY_PATH?",
    ]
    # the settings' own variables (service_env sets three) are not warned about
    quiet = cli(
        "trace",
        "c",
        "--file",
        str(tmp_path / "none.jsonl"),
        env=_unchecked(tmp_path),
        cwd=tmp_path,
    )
    assert "warning" not in quiet.stderr


def test_a_service_started_alone_checks_its_own_variables(tmp_path: Path) -> None:
    env = _unchecked(tmp_path, CODEMODE_RUNTIME_POOL_SIZ="2")
    proc, lines = spawn(
        [sys.executable, "-m", "runtime_service", "--listen", "127.0.0.1:0"],
        env,
        tmp_path,
        tmp_path / "runtime.err",
    )
    try:
        lines.expect(lambda line: "listening" in line, timeout=60)
    finally:
        status = _interrupt(proc)
    err = (tmp_path / "runtime.err").read_text()
    assert "unknown environment variable CODEMODE_RUNTIME_POOL_SIZ" in err
    assert "did you mean CODEMODE_RUNTIME_POOL_SIZE?" in err
    assert status == ExitCode.INTERRUPTED and "Traceback" not in err


def test_the_log_level_setting_reaches_the_services(tmp_path: Path) -> None:
    service = ["registry", "--listen", "127.0.0.1:0"]
    cases = [
        ("env-info", {"CODEMODE_LOG_LEVEL": "info"}, [], " INFO ", True),
        ("env-warning", {"CODEMODE_LOG_LEVEL": "warning"}, [], " INFO ", False),
        ("flag-debug", {}, ["--log-level", "debug"], " DEBUG ", True),
        ("default", {}, [], " DEBUG ", False),
    ]
    for name, extra, flags, marker, shown in cases:
        err = tmp_path / f"registry-{name}.err"
        env = {**service_env(tmp_path), **extra}
        if not extra:  # the machine's own setting would decide otherwise
            env.pop("CODEMODE_LOG_LEVEL", None)
        proc, lines = spawn([*CLI, *flags, *service], env, tmp_path, err)
        try:
            lines.expect(lambda line: "listening" in line)
        finally:
            _interrupt(proc)
        assert (marker in err.read_text()) is shown, (name, err.read_text())
    bad = cli(
        "trace", "x", env={**service_env(tmp_path), "CODEMODE_LOG_LEVEL": "loud"}, cwd=tmp_path
    )
    assert bad.returncode == ExitCode.USAGE
    assert "CODEMODE_LOG_LEVEL: expected one of debug, info, warning, error, critical" in bad.stderr
    flag = cli("--log-level", "loud", "trace", "x", env=service_env(tmp_path), cwd=tmp_path)
    assert flag.returncode == ExitCode.USAGE  # argparse's own refusal


def test_ctrl_c_stops_the_registry_with_130_and_no_traceback(tmp_path: Path) -> None:
    err = tmp_path / "registry.err"
    proc, lines = spawn(
        [*CLI, "registry", "--listen", "127.0.0.1:0"], service_env(tmp_path), tmp_path, err
    )
    listening_port(lines.expect(lambda line: "listening" in line))
    assert _interrupt(proc) == ExitCode.INTERRUPTED
    assert "Traceback" not in err.read_text()


def test_ctrl_c_stops_up_with_130_and_every_child_stopped(tmp_path: Path) -> None:
    err = tmp_path / "up.err"
    argv = [*CLI, "up", "--registry-listen", "127.0.0.1:0", "--runtime-listen", "127.0.0.1:0"]
    proc, lines = spawn(argv, service_env(tmp_path), tmp_path, err)
    lines.expect(lambda line: line.startswith("connect:"), timeout=90)
    assert _interrupt(proc) == ExitCode.INTERRUPTED, err.read_text()
    rest = lines.rest()
    assert "registry stopped" in rest and "runtime stopped" in rest
    assert "Traceback" not in err.read_text()


def test_ctrl_c_stops_a_loadtest_with_130_and_leaves_no_empty_folder(tmp_path: Path) -> None:
    out = tmp_path / "results" / "run-1"
    err = tmp_path / "loadtest.err"
    argv = [*CLI, "loadtest", "--programs", "100000", "--calls", "1", "--out", str(out)]
    proc, _ = spawn(argv, service_env(tmp_path), tmp_path, err)
    deadline = time.monotonic() + 60
    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # a latch on the folder existing, not a timing assumption
    assert out.exists(), err.read_text()
    assert _interrupt(proc) == ExitCode.INTERRUPTED, err.read_text()
    assert "Traceback" not in err.read_text()
    assert not (tmp_path / "results").exists()


def test_a_taken_port_says_address_already_in_use(tmp_path: Path, taken_port: int) -> None:
    for service in ("registry", "runtime"):
        done = cli(
            service, "--listen", f"127.0.0.1:{taken_port}", env=service_env(tmp_path), cwd=tmp_path
        )
        assert done.returncode == ExitCode.UNAVAILABLE, done.stderr
        assert "Address already in use" in done.stderr.splitlines()[-1], done.stderr


def _span(span_id: str, parent: str, name: str, **extra: object) -> dict[str, object]:
    return {
        "trace_id": "ab" * 16,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": name,
        "kind": "INTERNAL",
        "service": "codemode-registry",
        "start_ns": 1_000_000,
        "end_ns": 2_000_000,
        "status": "UNSET",
        "status_description": "",
        "attributes": {},
        "events": [],
        **extra,
    }


def _trace_file(path: Path, many: int = 0) -> None:
    failing = _span(
        "2" * 16,
        "1" * 16,
        "run_program",
        status="ERROR",
        status_description="Traceback (most recent call last):\n  line 2\nValueError: bad",
    )
    spans = [
        _span("1" * 16, "", "execute_tool run_code", attributes={"gen_ai.tool.call.id": "c1"}),
        failing,
    ]
    spans += [_span(f"{i + 16:016x}", "1" * 16, f"execute_tool t{i}") for i in range(many)]
    path.write_text("".join(json.dumps(s) + "\n" for s in spans))


def test_trace_keeps_every_line_of_an_error(tmp_path: Path) -> None:
    _trace_file(tmp_path / "traces.jsonl")
    done = cli(
        "trace",
        "c1",
        "--file",
        str(tmp_path / "traces.jsonl"),
        env=service_env(tmp_path),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "run_program [codemode-registry]" in done.stdout
    assert "Traceback (most recent call last):" in done.stdout
    assert "line 2" in done.stdout and "ValueError: bad" in done.stdout


def test_trace_outside_the_services_folder_hints_at_file(tmp_path: Path) -> None:
    done = cli("trace", "call-1", env=service_env(tmp_path), cwd=tmp_path)
    assert done.returncode == ExitCode.NOT_FOUND
    assert f"no trace file var/traces.jsonl in {tmp_path}" in done.stderr
    assert "--file PATH" in done.stderr
    _trace_file(tmp_path / "traces.jsonl")
    missing = cli(
        "trace",
        "other",
        "--file",
        str(tmp_path / "traces.jsonl"),
        env=service_env(tmp_path),
        cwd=tmp_path,
    )
    assert missing.returncode == ExitCode.NOT_FOUND


def test_trace_piped_to_head_ends_quietly_by_sigpipe(tmp_path: Path) -> None:
    _trace_file(tmp_path / "traces.jsonl", many=20_000)  # far more than a pipe holds
    done = piped_to_head(
        ["trace", "c1", "--file", str(tmp_path / "traces.jsonl")], service_env(tmp_path), tmp_path
    )
    assert done.returncode == ExitCode.PIPE_CLOSED, done.stderr
    assert done.stderr == "" and len(done.stdout) == 10
    assert os.path.exists(tmp_path / "traces.jsonl")
