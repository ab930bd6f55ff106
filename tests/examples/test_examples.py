"""Every file in examples/ runs, twice, against real services started by the testing kit
(`codemode_client.testing`: its `codemode_services` fixture is `codemode up` on free ports).

The Python client example, the programs `codemode run` executes (Python and TypeScript), and the
TypeScript client example compiled in a fresh CommonJS npm project that installs the client from
`npm pack`'s tarball. Each file says what it prints (an "It prints:" block) or what its value is
(an "Its value:" line), and the test compares exactly that, so the comments cannot drift from
what the examples do. A second run of each must work as well as the first (an example that only
works once is a trap for the next reader).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from codemode_client.testing import CodemodeServices, Testbed, expect
from tests.cli._processes import cli, spawn
from tests.typescript_build import built_client

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TS_VERSIONS = {"typescript": "5.9.3", "@types/node": "20.19.43"}  # as pinned by the client
_COMMENT = re.compile(r"^\s*(?:#|//) ?")


def _uncommented(path: Path) -> list[str]:
    """The file's lines without a leading `#`/`//` comment marker (docstrings have none)."""
    return [_COMMENT.sub("", line, count=1).rstrip() for line in path.read_text().splitlines()]


def printed_lines(path: Path) -> list[str]:
    """The indented lines of the file's "It prints" block, after its (optional) blank line."""
    lines = _uncommented(path)
    start = next(i for i, line in enumerate(lines) if "It prints" in line) + 1
    if start < len(lines) and not lines[start]:
        start += 1
    block: list[str] = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    assert block, f"{path} has an empty 'It prints' block"
    return block


def stated_value(path: Path) -> object:
    """The JSON on the line after the file's "Its value:"."""
    lines = _uncommented(path)
    index = next(i for i, line in enumerate(lines) if line.endswith("Its value:"))
    return json.loads(lines[index + 1])


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
def stack(codemode_services: CodemodeServices) -> Iterator[Stack]:
    """The kit's services (`up` offers both languages: its runtime serves them) with the demo
    provider the programs call."""
    address, env, tmp = codemode_services.address, codemode_services.env, codemode_services.workdir
    provider, ready = spawn(
        [sys.executable, "-m", "codemode_client.demo_tools", address], env, tmp, tmp / "p.err"
    )
    try:
        ready.expect(lambda line: line == "ready")
        yield Stack(address, env, tmp)
    finally:
        _stop(provider)


@pytest.mark.parametrize("program_file", ["count_todos.py", "count_todos.ts"])
def test_the_program_runs_with_codemode_run(stack: Stack, program_file: str) -> None:
    program = EXAMPLES / "programs" / program_file
    agent = f"todo-counter-{program.suffix[1:]}"  # one agent per language
    for _ in range(2):
        done = cli(
            "run", str(program), "--agent", agent, "--create-agent", "--json",
            "--registry", stack.address, env=stack.env, cwd=stack.tmp,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["is_error"] is False
        assert report["value"] == stated_value(program)


async def test_the_quick_start_serves_your_tools_to_programs_through_scripts_codemode(
    stack: Stack, codemode: Testbed
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
            program = EXAMPLES / "programs" / program_file
            agent = f"quick-start-{program.suffix[1:]}"
            for _ in range(2):
                done = await asyncio.to_thread(
                    subprocess.run,
                    [str(ROOT / "scripts" / "codemode"), "run", str(program), "--agent", agent,
                     "--create-agent", "--json", "--registry", stack.address],
                    capture_output=True, text=True, timeout=120, env=stack.env,
                    cwd=stack.tmp, check=False,
                )  # fmt: skip
                assert done.returncode == 0, done.stderr
                report = json.loads(done.stdout)
                assert report["is_error"] is False
                assert report["value"] == stated_value(program)
                trajectory = await codemode.trajectory(f"agents/{agent}", report["call_id"])
                trajectory.assert_recorded()
                trajectory.assert_nested(
                    expect("add", {"a": 2, "b": 3}, result=5, error_code=""),
                    expect("greet", {"name": "world"}, result="Hello, world!", error_code=""),
                )
    finally:
        _stop(tools)


def test_the_python_client_example_prints_what_it_says(stack: Stack) -> None:
    example = EXAMPLES / "python_client.py"
    expected = printed_lines(example)
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(example), stack.address],
            capture_output=True, text=True, timeout=120, env=stack.env, cwd=stack.tmp,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == expected
    # docs/clients.md quotes the example's core with its first line as a comment.
    quoted = re.search(r"# (result: .*)$", (ROOT / "docs" / "clients.md").read_text(), re.M)
    assert quoted is not None and quoted.group(1) == expected[0]


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


# Not a bound on time: two npm installs' worth of work and tsc take minutes on a loaded shared
# host; each child has its own timeout.
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm (Node 20)")
def test_the_typescript_example_compiles_in_a_fresh_npm_project(
    stack: Stack, tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    def npm(*args: str, cwd: Path) -> str:
        done = subprocess.run(
            ["npm", *args], capture_output=True, text=True, timeout=300, cwd=cwd, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    # This run's one build of the client (tests/typescript_build.py), packed as `prepack`
    # would have built it.
    client = built_client(pytestconfig)
    npm("pack", "--silent", "--ignore-scripts", "--pack-destination", str(tmp_path), cwd=client)
    (tarball,) = tmp_path.glob("codemode-client-*.tgz")
    project = tmp_path / "project"
    project.mkdir()
    npm("init", "-y", cwd=project)
    versions = {**TS_VERSIONS, **TS_MODEL_VERSIONS}
    pins = [f"{name}@{version}" for name, version in versions.items()]
    npm("install", "--prefer-offline", "--no-audit", "--no-fund", str(tarball), *pins, cwd=project)
    shutil.copy(EXAMPLES / "typescript" / "client.ts", project / "client.ts")
    shutil.copy(EXAMPLES / "typescript" / "model_agent.ts", project / "model_agent.ts")
    # The testing kit is the package's `./testing` export, types included.
    (project / "kit.ts").write_text(
        'import { TurnScript, runCode, useCodemode } from "@codemode/client/testing";\n'
        'const script = new TurnScript(runCode("return 1"));\n'
        "console.log(typeof useCodemode, script instanceof TurnScript);\n"
    )
    tsc = project / "node_modules" / ".bin" / "tsc"
    compiled = subprocess.run(
        [str(tsc), "--strict", "--module", "node16", "--target", "es2022", "--types", "node",
         "client.ts", "kit.ts", "model_agent.ts"],
        capture_output=True, text=True, timeout=180, cwd=project, check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    loaded = subprocess.run(
        ["node", "kit.js"], capture_output=True, text=True, timeout=60, cwd=project, check=False
    )
    assert loaded.stdout == "function true\n", loaded.stderr
    _run_the_typescript_model_example(stack, project)
    expected = printed_lines(EXAMPLES / "typescript" / "client.ts")
    for _ in range(2):
        done = subprocess.run(
            ["node", "client.js", stack.address],
            capture_output=True, text=True, timeout=120, cwd=project, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == expected


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
