"""Every file in examples/ runs, twice, against a real `codemode up` stack.

The Python client example, the programs `codemode run` executes (Python and TypeScript), and the
TypeScript client example compiled in a fresh CommonJS npm project that installs the client from
`npm pack`'s tarball.
A second run of each must work as well as the first (an example that only works once is a
trap for the next reader).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli._processes import CLI, cli, service_env, spawn

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TS_CLIENT = ROOT / "clients" / "typescript"
TS_VERSIONS = {"typescript": "5.9.3", "@types/node": "20.19.43"}  # as pinned by the client
# The model example's vendor clients, as pinned by the client's tests.
TS_MODEL_VERSIONS = {"openai": "7.55.0", "@anthropic-ai/sdk": "1.10.0"}
MODEL_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


def _offline(env: dict[str, str]) -> dict[str, str]:
    """`env` without the model keys: the model examples then use the scripted model."""
    return {k: v for k, v in env.items() if k not in MODEL_KEYS}


@dataclass
class Stack:
    address: str
    env: dict[str, str]
    tmp: Path


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("examples")
    env = service_env(tmp)  # `up` offers both languages: its runtimes serve them
    argv = [*CLI, "up", "--registry-listen", "127.0.0.1:0", "--runtime-listen", "127.0.0.1:0"]
    up, lines = spawn([*argv, "--runtimes", "1"], env, tmp, tmp / "up.err")
    try:
        lines.expect(lambda line: line.startswith("connect:"), timeout=60)
        registry = next(s for s in lines.seen if s.startswith("registry listening on "))
        address = registry.removeprefix("registry listening on ")
        provider, ready = spawn(
            [sys.executable, "-m", "codemode_client.demo_tools", address], env, tmp, tmp / "p.err"
        )
        try:
            ready.expect(lambda line: line == "ready")
            yield Stack(address, env, tmp)
        finally:
            _stop(provider)
    finally:
        _stop(up)


@pytest.mark.parametrize("program_file", ["count_todos.py", "count_todos.ts"])
def test_the_program_runs_with_codemode_run(stack: Stack, program_file: str) -> None:
    program = str(EXAMPLES / "programs" / program_file)
    agent = f"todo-counter-{Path(program_file).suffix[1:]}"  # one agent per language
    for _ in range(2):
        done = cli(
            "run", program, "--agent", agent, "--create-agent", "--json",
            "--registry", stack.address, env=stack.env, cwd=stack.tmp,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["is_error"] is False
        assert report["value"]["result"]["total"] >= 1
        assert report["value"]["logs"][0].endswith("files in the workspace")


def test_the_quick_start_serves_your_tools_to_programs_through_scripts_codemode(
    stack: Stack,
) -> None:
    """The README's quick start: `examples/my_tools.py` serves `add` and `greet`, and the
    `hello` programs call them through the `scripts/codemode` wrapper (no venv activated)."""
    tools, ready = spawn(
        [sys.executable, str(EXAMPLES / "my_tools.py"), stack.address],
        stack.env, stack.tmp, stack.tmp / "my_tools.err",
    )  # fmt: skip
    try:
        ready.expect(lambda line: line == "ready")
        for program_file in ("hello.py", "hello.ts"):
            agent = f"quick-start-{Path(program_file).suffix[1:]}"
            for _ in range(2):
                done = subprocess.run(
                    [str(ROOT / "scripts" / "codemode"), "run",
                     str(EXAMPLES / "programs" / program_file), "--agent", agent,
                     "--create-agent", "--json", "--registry", stack.address],
                    capture_output=True, text=True, timeout=120, env=stack.env,
                    cwd=stack.tmp, check=False,
                )  # fmt: skip
                assert done.returncode == 0, done.stderr
                report = json.loads(done.stdout)
                assert report["is_error"] is False
                assert report["value"] == {"logs": ["Hello, world!"], "result": 5}
                assert [call["tool_name"] for call in report["nested"]] == ["add", "greet"]
    finally:
        _stop(tools)


def test_the_python_client_example_runs_twice(stack: Stack) -> None:
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "python_client.py"), stack.address],
            capture_output=True, text=True, timeout=120, env=stack.env, cwd=stack.tmp,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        expected_lines = len((EXAMPLES / "programs" / "count_todos.py").read_text().splitlines())
        assert lines[0] == f"result: {{'logs': [], 'result': {expected_lines}}}"
        assert lines[1] == f"history: {run} nested calls so far"
        assert lines[2] == "refused: AGENT_NOT_FOUND codemode.registry"


def _model_example_says(tools: str, run: int) -> list[str]:
    """What a model example prints on its `run`-th run with the scripted model: the tools it
    offered, run_code's success, the answer built from the result, the growing history."""
    return [
        f"model: scripted · tools: {tools}",
        "tool call run_code: ok",
        "answer: The sum is 42.",
        f"history: {run} run_code calls so far",
    ]


def test_the_python_model_example_runs_twice_against_the_scripted_model(stack: Stack) -> None:
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "model_agent.py"), stack.address],
            capture_output=True, text=True, timeout=120, env=_offline(stack.env), cwd=stack.tmp,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == _model_example_says("['run_code']", run)


@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm (Node 20)")
def test_the_typescript_example_compiles_in_a_fresh_npm_project(
    stack: Stack, tmp_path: Path
) -> None:
    def npm(*args: str, cwd: Path) -> str:
        done = subprocess.run(
            ["npm", *args], capture_output=True, text=True, timeout=300, cwd=cwd, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    npm("pack", "--silent", "--pack-destination", str(tmp_path), cwd=TS_CLIENT)
    (tarball,) = tmp_path.glob("codemode-client-*.tgz")
    project = tmp_path / "project"
    project.mkdir()
    npm("init", "-y", cwd=project)
    versions = {**TS_VERSIONS, **TS_MODEL_VERSIONS}
    pins = [f"{name}@{version}" for name, version in versions.items()]
    npm("install", "--prefer-offline", "--no-audit", "--no-fund", str(tarball), *pins, cwd=project)
    shutil.copy(EXAMPLES / "typescript" / "client.ts", project / "client.ts")
    shutil.copy(EXAMPLES / "typescript" / "model_agent.ts", project / "model_agent.ts")
    tsc = project / "node_modules" / ".bin" / "tsc"
    compiled = subprocess.run(
        [str(tsc), "--strict", "--module", "node16", "--target", "es2022", "--types", "node",
         "client.ts", "model_agent.ts"],
        capture_output=True, text=True, timeout=180, cwd=project, check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    _run_the_typescript_model_example(stack, project)
    for _ in range(2):
        done = subprocess.run(
            ["node", "client.js", stack.address],
            capture_output=True, text=True, timeout=120, cwd=project, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert "nested: " in lines[0] and "read_ts_example" in lines[0]
        assert "log: contents of a.txt" in lines
        assert "result: 9007199254740993" in lines
        assert lines[-1] == "refused: NOT_FOUND AGENT_NOT_FOUND codemode.registry"


def _run_the_typescript_model_example(stack: Stack, project: Path) -> None:
    script = EXAMPLES / "models" / "scripted.json"
    model, ready = spawn(
        [sys.executable, "-m", "codemode_cli.scripted_model", "--script", str(script)],
        stack.env, stack.tmp, stack.tmp / "scripted.err",
    )  # fmt: skip
    try:
        port = ready.expect(lambda line: line.startswith("scripted model listening on port "))
        url = f"http://127.0.0.1:{port.rsplit(' ', 1)[1]}"
        for run in (1, 2):
            done = subprocess.run(
                ["node", "model_agent.js", stack.address, url],
                capture_output=True, text=True, timeout=120, cwd=project,
                env=_offline(dict(os.environ)), check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines() == _model_example_says("run_code", run)
    finally:
        _stop(model)
