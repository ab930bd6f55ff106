"""TypeScript programs through ``RuntimeService.Run`` (real gRPC on loopback, real Node workers
forked by the fork server into the same sandbox as Python's): what is TypeScript's own. What
every language must do alike is the language corpus's (``language_corpus/``, run by
``test_language_corpus.py``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.server import RunningRuntime
from tests.runtime.conftest import (
    can_isolate,
    connected,
    drive,
    grpc_settings,
    serving,
    start_message,
    streamed_logs,
)

pb = runtime_pb2
Stub = runtime_pb2_grpc.RuntimeServiceStub


@pytest.fixture
async def ts_server() -> AsyncIterator[RunningRuntime]:
    async with serving(grpc_settings(typescript_pool_size=1)) as running:
        yield running


@pytest.fixture
async def ts_stub(ts_server: RunningRuntime) -> AsyncIterator[Stub]:
    async with connected(ts_server) as client:
        yield client


def in_language(language: str, request: runtime_pb2.RunRequest) -> runtime_pb2.RunRequest:
    request.start.language = language
    return request


def ts(program: str, *names: str, **limits: Any) -> runtime_pb2.RunRequest:
    return in_language("typescript", start_message(program, *names, **limits))


def outcome(terminal: runtime_pb2.RunTerminal) -> tuple[str, str]:
    """(``success``, value JSON) or (failure kind name, message)."""
    if terminal.WhichOneof("outcome") == "success":
        value = terminal.success
        return "success", value.value_json if value.HasField("value_json") else ""
    return pb.FailureKind.Name(terminal.failure.kind), terminal.failure.message


async def test_capabilities_list_both_languages(ts_stub: Stub) -> None:
    caps = await ts_stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert list(caps.languages) == ["python", "typescript"]


async def test_a_typescript_program_runs_end_to_end(ts_stub: Stub) -> None:
    program = (
        "interface Reply { echo: { n: number } }\n"
        "console.log('start');\n"
        "const first = (await tools.lookup({ n: 1 })) as Reply;\n"
        "const [a, b] = await Promise.all([tools.lookup({ n: 2 }), tools['my-tool']({ n: 3 })]);\n"
        "console.log('got', first.echo.n);\n"
        "return { first, a, b, big: 2n ** 64n };\n"
    )
    seen, terminal = await drive(ts_stub, ts(program, "lookup", "my-tool"))
    calls = [m.binding_call for m in seen if m.WhichOneof("kind") == "binding_call"]
    assert [(c.binding_name, json.loads(c.arguments_json)) for c in calls] == [
        ("lookup", {"n": 1}),
        ("lookup", {"n": 2}),
        ("my-tool", {"n": 3}),
    ]
    assert list(terminal.logs) == streamed_logs(seen) == ["start", "got 1"]
    kind, value = outcome(terminal)
    assert kind == "success"
    assert json.loads(value) == {
        "first": {"echo": {"n": 1}},
        "a": {"echo": {"n": 2}},
        "b": {"echo": {"n": 3}},
        "big": 2**64,
    }


async def test_the_worker_is_sandboxed_like_pythons(
    ts_stub: Stub, ts_server: RunningRuntime
) -> None:
    port = ts_server.port
    program = (
        "const net = process.getBuiltinModule('node:net');\n"
        "const reached = await new Promise((resolve) => {\n"
        f"  const socket = net.connect({port}, '127.0.0.1');\n"
        "  socket.on('connect', () => resolve('connected'));\n"
        "  socket.on('error', (error: any) => resolve(error.code));\n"
        "});\n"
        "const fs = process.getBuiltinModule('node:fs');\n"
        "const status = fs.readFileSync('/proc/self/status', 'utf8').split('\\n')\n"
        "  .filter((line: string) => /^(NoNewPrivs|Seccomp):/.test(line));\n"
        "const procs = fs.readdirSync('/proc').filter((name: string) => /^[0-9]+$/.test(name));\n"
        "return { reached, uid: process.getuid(), cwd: process.cwd(), env: process.env,"
        " root: fs.readdirSync('/').sort(), status, procs };\n"
    )
    _, terminal = await drive(ts_stub, ts(program))
    kind, value = outcome(terminal)
    assert kind == "success", value
    seen = json.loads(value)
    assert seen["reached"] != "connected"  # its own empty network namespace
    assert seen["env"] == {}
    if can_isolate():
        assert seen["uid"] >= 60_000
        assert seen["cwd"] == "/tmp"
        assert "home" not in seen["root"] and "etc" in seen["root"]
        # Node is dumpable again after the exec; what keeps others out of it: its own pid
        # namespace (the run's init and itself), its own uid, no_new_privs and the seccomp
        # filter (no ptrace) -- all kept across the exec.
        assert sorted(seen["procs"]) == ["1", "2"]
        assert seen["status"] == ["NoNewPrivs:\t1", "Seccomp:\t2"]


async def test_out_of_memory_is_worker_exit_and_the_host_stays_healthy(ts_stub: Stub) -> None:
    program = "const a: string[] = [];\nwhile (true) a.push('x'.repeat(100000) + a.length);\n"
    _, terminal = await drive(ts_stub, ts(program, memory_bytes=128 << 20, wall_ms=20_000))
    kind, message = outcome(terminal)
    assert kind == "FAILURE_KIND_WORKER_EXIT", message
    _, terminal = await drive(ts_stub, ts("return 1;"))
    assert outcome(terminal) == ("success", "1")


async def test_non_erasable_syntax_fails_before_any_code_runs(ts_stub: Stub) -> None:
    seen, terminal = await drive(ts_stub, ts("console.log('ran');\nenum Color { Red }\n"))
    assert streamed_logs(seen) == []
    assert outcome(terminal) == (
        "FAILURE_KIND_EXCEPTION",
        "SyntaxError: TypeScript enum is not supported in strip-only mode\n    at program.ts:2:1",
    )


async def test_a_checkout_under_tmp_still_runs_typescript(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The private root is mounted over /tmp; a project cloned below /tmp (as CI clones are)
    # must still have its worker directory in the sandbox. Before the fix: MODULE_NOT_FOUND.
    import shutil

    from runtime_service.languages import typescript

    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip(f"the test's temporary directory is not below /tmp: {tmp_path}")
    copy = tmp_path / "checkout" / "worker_ts"
    shutil.copytree(typescript.WORKER_DIR, copy, symlinks=True)
    monkeypatch.setattr(typescript, "WORKER_DIR", str(copy))
    async with (
        serving(grpc_settings(typescript_pool_size=0)) as running,
        connected(running) as stub,
    ):
        _, terminal = await drive(stub, ts("return 40 + 2"))
    assert outcome(terminal) == ("success", "42"), terminal


# Grows the heap until something stops it (strings kept reachable, 100 kB each).
ALLOCATES = "const a: string[] = [];\nwhile (true) a.push('x'.repeat(100000) + a.length);\n"


@pytest.mark.parametrize("cgroups", ["auto", "off"])
async def test_the_runs_memory_budget_bounds_its_heap(cgroups: str) -> None:
    """V8's heap limit is the run's own budget (not the default's): a 96 MiB run that
    allocates without end is ``worker-exit`` naming its budget, with or without a run
    cgroup. Without one, V8's heap limit is all that stops it: Node aborts (SIGABRT) and the
    runtime reports it as the budget it is, not as a signal."""
    settings = grpc_settings(typescript_pool_size=1, cgroups=cgroups)
    async with serving(settings) as running, connected(running) as stub:
        first = ts(ALLOCATES, memory_bytes=96 << 20, wall_ms=30_000)
        _, terminal = await drive(stub, first)
        kind, message = outcome(terminal)
        assert kind == "FAILURE_KIND_WORKER_EXIT", message
        assert "memory budget (96 MiB" in message, message
        _, terminal = await drive(stub, ts("return 1;"))
        assert outcome(terminal) == ("success", "1")
        assert running.runtime.pools["typescript"].idle_count <= 1


def _mechanisms(isolation: runtime_pb2.Isolation) -> list[tuple[str, bool, int]]:
    return [(item.name, item.enforced, item.scope) for item in isolation.mechanisms]


async def test_capabilities_describe_each_languages_own_worker(ts_stub: Stub) -> None:
    caps = await ts_stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert sorted(caps.language_isolation) == ["python", "typescript"]
    python = caps.language_isolation["python"]
    typescript = caps.language_isolation["typescript"]
    assert python == caps.isolation
    assert [line for line in python.enforced if line.startswith("interpreter:")] == [
        "interpreter: isolated (-I -S): no site-packages, no user paths, no PYTHON* variables"
    ]
    (node,) = [line for line in typescript.enforced if line.startswith("interpreter:")]
    assert "--disallow-code-generation-from-strings" in node and "heap limit" in node, node
    # Node is isolated by the same steps and keeps every one of them across its exec.
    assert _mechanisms(typescript) == _mechanisms(python)
    assert typescript.mechanism == python.mechanism
    if can_isolate():
        assert all(item.enforced for item in typescript.mechanisms), typescript.mechanisms
        memory = [line for line in typescript.enforced if line.startswith("memory of workers")]
        assert memory and "seccomp" in memory[0], typescript.enforced


async def test_capabilities_of_typescript_are_measured_not_copied() -> None:
    # A Node that cannot start: its isolation is unknown, Python's is unaffected.
    settings = grpc_settings(worker_node="/nonexistent/node")
    async with serving(settings) as running, connected(running) as stub:
        caps = await stub.GetCapabilities(pb.GetCapabilitiesRequest())
    typescript = caps.language_isolation["typescript"]
    failed = [item for item in typescript.mechanisms if not item.enforced]
    assert failed and all(
        "worker failed to start" in item.detail for item in failed if item.name == "seccomp"
    )
    assert caps.language_isolation["python"] == caps.isolation
    assert _mechanisms(caps.isolation) != _mechanisms(typescript)
