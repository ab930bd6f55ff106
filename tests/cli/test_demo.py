"""The README's main job: `codemode demo` runs both services and a real program."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from codemode_cli.exit_codes import ExitCode


def test_demo_prints_the_nested_trajectory_and_outer_result() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "codemode_cli", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "schemas the model sees: ['run_code']" in out
    assert "a direct read_file call is refused: UNKNOWN_TOOL" in out
    assert "5 nested calls" in out
    assert "call-1:code:5" in out and "error ENOENT" in out
    assert '"total": 3' in out
    assert "'tool/code-dispatch': 5" in out


def test_demo_in_typescript_runs_the_same_trajectory() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "codemode_cli", "demo", "--language", "typescript"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "agents/demo-agent (mode code, typescript)" in out
    assert "│ const files: string[] = await tools.list_files({});" in out
    assert "schemas the model sees: ['run_code']" in out
    assert "a direct read_file call is refused: UNKNOWN_TOOL" in out
    assert "5 nested calls" in out
    assert "call-1:code:5" in out and "error ENOENT" in out
    assert "expected failure from read_file: no such file: missing.txt" in out
    assert '"total": 3' in out
    assert "'tool/code-dispatch': 5" in out


def test_demo_exports_to_an_otlp_endpoint_from_the_environment() -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set, the demo crashed looking for its trace file;
    now its spans reach the collector (a real HTTP/protobuf receiver on loopback here)."""
    posted: list[str] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            posted.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "codemode_cli", "demo"],
            capture_output=True,
            text=True,
            timeout=180,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    assert "trace of call-1: exported to otlp http/protobuf" in done.stdout
    assert "/v1/traces" in posted


def test_help_lists_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "codemode_cli", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "demo" in done.stdout


def test_a_failed_program_fails_the_demo_and_trace_finds_the_demos_call(tmp_path: Path) -> None:
    """The demo keeps its spans in var/traces.jsonl of the folder it runs in, where
    `codemode trace` looks; a program whose result is an error ends the demo with status 1."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    (tmp_path / "bad.py").write_text('await tools.list_files({})\nraise ValueError("bad")\n')
    done = subprocess.run(
        [sys.executable, "-m", "codemode_cli", "demo", "--program", "bad.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == ExitCode.FAILED, done.stderr
    assert "outer result [error CODE_RUN_FAILED]" in done.stdout
    traced = subprocess.run(
        [sys.executable, "-m", "codemode_cli", "trace", "call-1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert traced.returncode == 0, traced.stderr
    assert "execute_tool run_code [codemode-registry]" in traced.stdout
    assert "execute_tool list_files call-1:code:1" in traced.stdout
    assert 'raise ValueError("bad")' in traced.stdout  # the traceback, every line of it
