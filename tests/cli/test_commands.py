"""`codemode up | registry | runtime | run | history`, driven as real processes over loopback.

One `up` stack (two runtimes, ports 0) with the demo tool provider serves most tests; the tests
that stop or break a stack start their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from codemode_cli.exit_codes import ExitCode
from tests.cli._processes import (
    CLI,
    Lines,
    cli,
    command_line,
    free_port,
    listening_port,
    piped_to_head,
    service_env,
    spawn,
    stop,
    wait_gone,
)
from tests.procfs import descendants
from tests.typescript_build import built_console

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for child pids")

FAN_OUT = """\
import asyncio

files = await tools.list_files({})
print(f"{len(files)} files")
texts = await asyncio.gather(*(tools.read_file({"path": p}) for p in files))
try:
    await tools.read_file({"path": "missing.txt"})
except ToolCallError as e:
    print(f"expected: {e}")
return {"files": len(texts)}
"""

RAISES = """\
await tools.list_files({})
raise ValueError("boom")
"""

TS_FAN_OUT = """\
const files: string[] = await tools.list_files({});
console.log(`${files.length} files`);
const texts = await Promise.all(files.map((path) => tools.read_file({ path })));
return { files: texts.length };
"""


@dataclass
class Stack:
    registry: str
    up_lines: list[str]
    env: dict[str, str]
    tmp: Path

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """`codemode ARGS --registry <this stack>`."""
        return cli(*args, "--registry", self.registry, env=self.env, cwd=self.tmp, stdin=stdin)

    def program(self, text: str, suffix: str = ".py") -> str:
        path = self.tmp / f"program-{uuid.uuid4().hex[:8]}{suffix}"
        path.write_text(text)
        return str(path)


def _up(tmp: Path, runtimes: int) -> tuple[subprocess.Popen[str], Lines]:
    """Starts `codemode up` on free ports; returns it and its output once it is ready."""
    argv = [*CLI, "up", "--registry-listen", "127.0.0.1:0", "--runtime-listen", "127.0.0.1:0"]
    proc, lines = spawn([*argv, "--runtimes", str(runtimes)], service_env(tmp), tmp, tmp / "up.err")
    try:
        lines.expect(lambda line: line.startswith("connect:"), timeout=60)
    except AssertionError:
        stop(proc, signal.SIGKILL)
        raise AssertionError((tmp / "up.err").read_text()) from None
    return proc, lines


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    up, lines = _up(tmp, runtimes=2)
    seen = list(lines.seen)
    try:
        registry = next(line for line in seen if line.startswith("registry listening on "))
        address = registry.removeprefix("registry listening on ")
        provider, provider_lines = spawn(
            [sys.executable, "-m", "codemode_client.demo_tools", address],
            service_env(tmp),
            tmp,
            tmp / "provider.err",
        )
        try:
            provider_lines.expect(lambda line: line == "ready")
            yield Stack(address, seen, service_env(tmp), tmp)
        finally:
            stop(provider)
    finally:
        stop(up)


def test_up_prints_every_address_and_how_to_connect(stack: Stack) -> None:
    runtimes = [line for line in stack.up_lines if line.startswith("runtime-")]
    assert [line.split()[0] for line in runtimes] == ["runtime-1", "runtime-2"]
    ports = {listening_port(line) for line in runtimes}
    assert len(ports) == 2 and 0 not in ports
    assert listening_port(f"registry listening on {stack.registry}") not in {0, *ports}
    hint = stack.up_lines[-1]
    assert (
        f"codemode run PROGRAM.py --agent NAME --create-agent --registry {stack.registry}" in hint
    )


def test_run_prints_nested_calls_live_then_the_result(stack: Stack) -> None:
    done = stack.cli("run", stack.program(FAN_OUT), "--agent", "cli-live", "--create-agent")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("run_code run-") and "agents/cli-live" in lines[0]
    started = [line.split() for line in lines if line.lstrip().startswith("started")]
    settled = [line.split() for line in lines if line.lstrip().startswith("settled")]
    assert [s[2] for s in started] == ["list_files"] + ["read_file"] * 4
    assert {s[1] for s in started} == {s[1] for s in settled}
    assert [s[3:5] for s in settled if s[1].endswith(":code:5")] == [["error", "ENOENT"]]
    assert all(s[-1] == "ms" for s in settled)
    # every call starts before it settles
    order = [(line.split()[0], line.split()[1]) for line in lines if ":code:" in line]
    for sub_call in {s[1] for s in started}:
        assert order.index(("started", sub_call)) < order.index(("settled", sub_call))
    tail = done.stdout.split("result [ok] (5 nested calls):\n", 1)[1]
    assert "3 files" in tail and "expected: no such file: missing.txt" in tail
    assert '"files": 3' in tail


def test_run_json_and_history_of_the_call(stack: Stack) -> None:
    call_id = f"json-{uuid.uuid4().hex[:6]}"
    options = ["--create-agent", "--json", "--call-id", call_id, "--description", "count files"]
    done = stack.cli("run", stack.program(FAN_OUT), "--agent", "agents/cli-json", *options)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["call_id"], out["agent"], out["is_error"]) == (call_id, "agents/cli-json", False)
    logs = ["3 files", "expected: no such file: missing.txt"]
    assert out["value"] == {"logs": logs, "result": {"files": 3}}
    assert [n["sub_call_id"] for n in out["nested"]] == [f"{call_id}:code:{i}" for i in range(1, 6)]
    assert [n["error_code"] for n in out["nested"]] == ["", "", "", "", "ENOENT"]
    assert all(n["duration_ms"] >= 0 for n in out["nested"])

    # --call-id alone: the registry is asked under every agent
    listed = stack.cli("history", "--call-id", call_id)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    kinds = [row[2] for row in rows]
    assert kinds[0] == "tool/call" and kinds[-1] == "tool/result"
    assert kinds.count("tool/code-dispatch-start") == kinds.count("tool/code-dispatch") == 5
    assert rows[-1][3:6] == [call_id, "run_code", "ok"]
    failed = [row for row in rows if row[2] == "tool/code-dispatch" and row[5] == "error"]
    assert [(row[3], row[6]) for row in failed] == [(f"{call_id}:code:5", "ENOENT")]

    as_json = stack.cli("history", "--agent", "cli-json", "--call-id", call_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["kind"] for r in records] == kinds
    assert records[0]["arguments"]["description"] == "count files"
    assert {r["root_call_id"] for r in records} == {call_id}
    assert records[-1]["content"][0]["text"].startswith("3 files")
    assert [r["seq"] for r in records] == sorted(r["seq"] for r in records)

    last = stack.cli("history", "--agent", "cli-json", "--limit", "1", "--json")
    assert [json.loads(line)["kind"] for line in last.stdout.splitlines()] == ["tool/result"]


def test_run_reads_the_program_from_stdin(stack: Stack) -> None:
    done = stack.cli("run", "-", "--agent", "cli-stdin", "--create-agent", stdin="return 6 * 7\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("42")


def test_a_program_that_raises_exits_1_with_the_error_result(stack: Stack) -> None:
    done = stack.cli("run", stack.program(RAISES), "--agent", "cli-raise", "--create-agent")
    assert done.returncode == 1, done.stderr
    assert "result [error CODE_RUN_FAILED]" in done.stdout
    assert "ValueError: boom" in done.stdout
    as_json = stack.cli("run", stack.program(RAISES), "--agent", "cli-raise", "--json")
    assert as_json.returncode == 1
    out = json.loads(as_json.stdout)
    assert out["is_error"] and out["error_code"] == "CODE_RUN_FAILED" and out["value"] is None


def test_run_takes_the_language_from_the_extension(stack: Stack) -> None:
    """`up` offers the languages its runtimes serve (here both, Python the default)."""
    ts = stack.cli("run", stack.program(TS_FAN_OUT, ".ts"), "--agent", "cli-ts", "--create-agent")
    assert ts.returncode == 0, ts.stderr
    assert "result [ok] (4 nested calls):\n3 files\n" in ts.stdout
    # The agent --create-agent made is a typescript one; a .py file is refused for it, clearly,
    # before anything runs, and --language says what a file with another extension holds.
    py = stack.cli("run", stack.program("return 1"), "--agent", "cli-ts")
    assert py.returncode == 2 and py.stdout == ""
    assert py.stderr.startswith("codemode run: agents/cli-ts runs typescript programs, not python")
    plain = stack.program("return [1, 2].length;", ".txt")
    unknown = stack.cli("run", plain, "--agent", "cli-ts")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr.strip() == (
        f"codemode run: cannot tell the language of {plain} from its extension "
        "(.py is python, .ts is typescript); pass --language python|typescript"
    )
    told = stack.cli("run", plain, "--agent", "cli-ts", "--language", "typescript", "--json")
    assert told.returncode == 0, told.stderr
    assert json.loads(told.stdout)["value"] == {"logs": [], "result": 2}
    # Python stays the default language of a .py file's --create-agent.
    again = stack.cli("run", stack.program("return 6 * 7"), "--agent", "cli-py", "--create-agent")
    assert again.returncode == 0, again.stderr
    assert again.stdout.rstrip().endswith("42")


def test_run_without_the_agent_asks_for_create_agent(stack: Stack) -> None:
    done = stack.cli("run", stack.program("return 1"), "--agent", "cli-nobody")
    assert done.returncode == ExitCode.NOT_FOUND
    assert done.stderr.startswith("codemode run: agents/cli-nobody does not exist")
    assert "--create-agent" in done.stderr and done.stdout == ""


def test_history_watch_follows_new_records_until_interrupted(stack: Stack) -> None:
    first = stack.cli("run", stack.program("return 1"), "--agent", "cli-watch", "--create-agent")
    assert first.returncode == 0, first.stderr
    follow = ["history", "--agent", "cli-watch", "--watch", "--json", "--registry", stack.registry]
    watch, lines = spawn([*CLI, *follow], stack.env, stack.tmp, stack.tmp / "watch.err")
    try:
        lines.expect(lambda line: json.loads(line)["kind"] == "tool/result")  # the listing
        second = stack.cli(
            "run", stack.program("return 2"), "--agent", "cli-watch", "--call-id", "w-2"
        )
        assert second.returncode == 0, second.stderr
        line = lines.expect(lambda line: json.loads(line)["kind"] == "tool/result")
        assert json.loads(line)["call_id"] == "w-2"
    finally:
        status = stop(watch, signal.SIGINT)
    assert status == 0, (stack.tmp / "watch.err").read_text()
    assert [json.loads(line)["kind"] for line in lines.seen].count("tool/call") == 2


def test_unreachable_registry_exits_unavailable_naming_the_address(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    program = tmp_path / "p.py"
    program.write_text("return 1\n")
    env = service_env(tmp_path)
    done = cli("run", str(program), "--agent", "a", "--registry", address, env=env, cwd=tmp_path)
    assert done.returncode == ExitCode.UNAVAILABLE and done.stdout == ""
    assert (
        done.stderr.strip() == f"codemode run: cannot reach the registry at {address} (UNAVAILABLE)"
    )
    listed = cli("history", "--agent", "a", "--registry", address, env=env, cwd=tmp_path)
    assert listed.returncode == ExitCode.UNAVAILABLE
    assert listed.stderr.startswith(f"codemode history: cannot reach the registry at {address}")


def test_unreadable_program_exits_2(tmp_path: Path) -> None:
    env = service_env(tmp_path)
    done = cli("run", str(tmp_path / "missing.py"), "--agent", "a", env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"codemode run: cannot read {tmp_path / 'missing.py'}: No such file or directory"
    )
    usage = cli("history", "--registry", "127.0.0.1:1", env=env, cwd=tmp_path)
    assert usage.returncode == 2 and "one of --agent or --call-id is required" in usage.stderr


def test_registry_and_runtime_commands_serve_until_sigterm(tmp_path: Path) -> None:
    env = service_env(tmp_path)
    registry, reg_lines = spawn(
        [*CLI, "registry", "--listen", "127.0.0.1:0"], env, tmp_path, tmp_path / "registry.err"
    )
    runtime, rt_lines = spawn(
        [*CLI, "runtime", "--listen", "127.0.0.1:0"], env, tmp_path, tmp_path / "runtime.err"
    )
    try:
        port = listening_port(reg_lines.expect(lambda line: "listening" in line))
        listening_port(rt_lines.expect(lambda line: "listening" in line))
        # the registry serves: its own refusal, not a connection error
        address = f"127.0.0.1:{port}"
        refused = cli("history", "--agent", "ghost", "--registry", address, env=env, cwd=tmp_path)
        assert refused.returncode == ExitCode.NOT_FOUND
        assert "refused" in refused.stderr and "NOT_FOUND" in refused.stderr
    finally:
        statuses = (stop(registry), stop(runtime))
    assert statuses == (0, 0), (tmp_path / "registry.err").read_text()


def test_up_stops_every_process_on_sigterm(tmp_path: Path) -> None:
    up, lines = _up(tmp_path, runtimes=2)
    children = descendants(up.pid)
    try:
        commands = [command_line(pid) for pid in children]
        assert sum("-m registry_service" in c for c in commands) == 1
        assert sum("-m runtime_service" in c for c in commands) == 2
    finally:
        status = stop(up)
    assert status == 0, (tmp_path / "up.err").read_text()
    assert lines.rest() == [
        "stopping: registry first, then the runtimes",
        "registry stopped",
        "runtime-1 stopped",
        "runtime-2 stopped",
    ]
    assert wait_gone(children) == set()  # the runtimes' workers too


def test_up_exits_nonzero_when_a_child_dies(tmp_path: Path) -> None:
    up, lines = _up(tmp_path, runtimes=1)
    runtime_port = listening_port(next(s for s in lines.seen if s.startswith("runtime listening")))
    children = {pid: command_line(pid) for pid in descendants(up.pid)}
    runtime = next(pid for pid, cmd in children.items() if "-m runtime_service" in cmd)
    registry = next(pid for pid, cmd in children.items() if "-m registry_service" in cmd)
    os.kill(runtime, signal.SIGKILL)
    try:
        status = up.wait(30)
    finally:
        stop(up, signal.SIGKILL)
    assert status == 1
    message = f"runtime on 127.0.0.1:{runtime_port} exited unexpectedly (killed by SIGKILL)"
    assert f"codemode up: {message}; stopping the rest" in (tmp_path / "up.err").read_text()
    assert lines.rest()[-1] == "registry stopped"
    assert wait_gone({registry}) == set()


@pytest.mark.parametrize("service", ["registry", "runtime"])
@pytest.mark.parametrize("moment", ["while starting", "at the listening line"])
def test_sigterm_right_away_still_stops_gracefully(
    tmp_path: Path, service: str, moment: str
) -> None:
    """Handlers are installed before the service starts: a supervisor's SIGTERM sent as soon as
    it reads the listening line, or while the service is still starting, drains and exits 0
    instead of killing the process (-15)."""
    err = tmp_path / f"{service}.err"
    proc, lines = spawn(
        [*CLI, service, "--listen", "127.0.0.1:0"], service_env(tmp_path), tmp_path, err
    )
    try:
        if moment == "while starting":
            # The traces line is logged after the handlers go in and before the server binds.
            for _ in range(6000):
                if "traces:" in err.read_text() or proc.poll() is not None:
                    break
                threading.Event().wait(0.005)
        else:
            lines.expect(lambda line: "listening" in line, timeout=60)
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert status == 0, err.read_text()


def test_up_with_the_console_serves_its_page_and_stops_it_first(tmp_path: Path) -> None:
    """`codemode up --console`: the console (a page runner, approver and history watcher for
    its agent, which it creates) serves its page on loopback to the browser that opens the URL
    it prints (with its key), and is stopped before the registry it is a client of."""
    import urllib.error
    import urllib.request
    from http.cookiejar import CookieJar
    from urllib.parse import urlsplit

    built_console()  # not inside up's 60 s start bound (tests/typescript_build.py)
    argv = [*CLI, "up", "--registry-listen", "127.0.0.1:0", "--runtime-listen", "127.0.0.1:0"]
    argv += ["--console", "--console-agent", "ops"]
    proc, lines = spawn(argv, service_env(tmp_path), tmp_path, tmp_path / "up.err")
    try:
        try:
            lines.expect(lambda line: line.startswith("connect:"), timeout=120)
        except AssertionError:
            raise AssertionError((tmp_path / "up.err").read_text()) from None
        line = next(s for s in lines.seen if s.startswith("console listening on "))
        url = line.removeprefix("console listening on ")
        parts = urlsplit(url)
        assert parts.hostname == "127.0.0.1" and parts.port and parts.query.startswith("key=")
        origin = f"http://127.0.0.1:{parts.port}/"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(origin, timeout=30)  # no session: nothing served
        assert refused.value.code == 403
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        with browser.open(url, timeout=30) as page:  # the key, exchanged for the cookie
            assert page.url == origin
            html = page.read().decode()
        assert "<title>Codemode console</title>" in html and 'src="app.js"' in html
        with browser.open(origin + "app.js", timeout=30) as bundle:
            assert b"data-plugin-slot" in bundle.read()
        registry = next(s for s in lines.seen if s.startswith("registry listening on "))
        address = registry.removeprefix("registry listening on ")
        history = cli(
            "history",
            "--agent",
            "ops",
            "--registry",
            address,
            env=service_env(tmp_path),
            cwd=tmp_path,
        )
        assert history.returncode == 0, history.stderr  # the console created its agent
    finally:
        status = stop(proc)
    assert status == 0, (tmp_path / "up.err").read_text()
    own = [line for line in lines.rest() if not line.startswith("[")]  # not children's lines
    assert own[:3] == [
        "stopping: the console, then the registry, then the runtimes",
        "console stopped",
        "registry stopped",
    ]


def test_history_of_an_unknown_call_exits_not_found(stack: Stack) -> None:
    done = stack.cli("history", "--call-id", "no-such-call")
    assert done.returncode == ExitCode.NOT_FOUND and done.stdout == ""
    assert "no records of call no-such-call under any agent" in done.stderr
    under = stack.cli("history", "--call-id", "no-such-call", "--agent", "cli-watch-none")
    assert under.returncode == ExitCode.NOT_FOUND


def test_run_timeout_expiry_is_a_timeout_not_a_usage_error(stack: Stack) -> None:
    program = stack.program("import asyncio\nawait asyncio.sleep(600)\n")
    args = ("run", program, "--agent", "cli-slow", "--create-agent", "--timeout", "2")
    done = stack.cli(*args)
    assert done.returncode == ExitCode.TIMEOUT, done.stderr
    assert "did not finish within --timeout 2 s (DEADLINE_EXCEEDED)" in done.stderr


BIG = "return 'x' * 300_000\n"  # more than a pipe holds


def test_run_and_history_piped_to_head_end_quietly_by_sigpipe(stack: Stack) -> None:
    program = stack.program(BIG)
    args = ["run", program, "--agent", "cli-pipe", "--create-agent", "--call-id", "pipe-1"]
    ran = piped_to_head([*args, "--registry", stack.registry], stack.env, stack.tmp)
    assert ran.returncode == ExitCode.PIPE_CLOSED, ran.stderr
    assert ran.stderr == "" and ran.stdout == "run_code p"
    history = ["history", "--call-id", "pipe-1", "--json", "--registry", stack.registry]
    listed = piped_to_head(history, stack.env, stack.tmp)
    # The records may be short enough to fit in the pipe (a large value is kept aside and
    # listed as its preview): then history has written everything before head exits.
    assert listed.returncode in (ExitCode.PIPE_CLOSED, ExitCode.OK), listed.stderr
    assert listed.stderr == "" and len(listed.stdout) == 10 and listed.stdout.startswith('{"seq":')
