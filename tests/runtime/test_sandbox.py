"""What a program can and cannot reach from inside its worker."""

from __future__ import annotations

import os

from runtime_service.runtime import Runtime
from tests.runtime.conftest import ProgramRunner


async def test_network_access_fails(run_program: ProgramRunner, runtime: Runtime) -> None:
    program = (
        "import socket\nout = []\n"
        "for host in ['127.0.0.1', '::1', '1.1.1.1']:\n"
        "    try:\n"
        "        socket.create_connection((host, 80), timeout=1).close()\n"
        "        out.append('connected')\n"
        "    except OSError as exc:\n"
        "        out.append(type(exc).__name__)\n"
        "return out"
    )
    result = await run_program(program)
    assert result.error is None
    assert "connected" not in result.value  # type: ignore[operator]
    worker = await runtime.pool.acquire()
    try:
        assert worker.sandbox.get("network") == "namespace"
    finally:
        await worker.kill()


async def test_environment_is_empty(run_program: ProgramRunner) -> None:
    os.environ["CODEMODE_TEST_SECRET"] = "leak"
    try:
        result = await run_program("import os\nreturn dict(os.environ)")
    finally:
        del os.environ["CODEMODE_TEST_SECRET"]
    assert result.value == {}


async def test_own_empty_working_directory(run_program: ProgramRunner) -> None:
    program = "import os\nopen('note.txt', 'w').write('x')\nreturn sorted(os.listdir('.'))"
    first = await run_program(program)
    second = await run_program(program)
    assert first.value == second.value == ["note.txt"]  # nothing carries over between runs


async def test_only_the_channel_and_stdio_are_open(run_program: ProgramRunner) -> None:
    program = (
        "import os\nout = {}\n"
        "for fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n        out[fd] = os.readlink('/proc/self/fd/' + fd)\n"
        "    except OSError:\n        pass\n"
        "return out"
    )
    result = await run_program(program)
    targets = result.value
    assert isinstance(targets, dict)
    assert {"0", "1", "2"} <= set(targets)
    for target in targets.values():
        # stdio pipes, the channel and the loop's self-pipe sockets, epoll, the listdir handle.
        assert target.startswith(("pipe:", "socket:", "anon_inode:", "/dev/null", "/proc/")), target


async def test_the_runtime_code_is_not_importable(run_program: ProgramRunner) -> None:
    result = await run_program(
        "import sys\nreturn [p for p in sys.path if 'runtime_service' in p or 'site-packages' in p]"
    )
    assert result.value == []


async def test_rlimits_are_applied(run_program: ProgramRunner) -> None:
    program = (
        "import resource\n"
        "return [resource.getrlimit(resource.RLIMIT_AS)[1],"
        " resource.getrlimit(resource.RLIMIT_NOFILE)[1],"
        " resource.getrlimit(resource.RLIMIT_CPU)[1] > 0]"
    )
    result = await run_program(program, memory_bytes=128 << 20)
    assert result.value == [128 << 20, 64, True]


async def test_no_state_survives_between_runs(run_program: ProgramRunner) -> None:
    first = await run_program(
        "global leaked\nleaked = 1\nimport builtins, os\nbuiltins.leaked_builtin = 2\n"
        "return [os.getpid(), os.getuid()]"
    )
    second = await run_program(
        "import builtins, os\n"
        "return [ 'leaked' in globals(), hasattr(builtins, 'leaked_builtin'), "
        "[os.getpid(), os.getuid()]]"
    )
    assert second.value[:2] == [False, False]  # type: ignore[index]
    # Another process: in a pid namespace of its own every worker is pid 2, but no two
    # workers in a row get the same uid.
    assert second.value[2] != first.value  # type: ignore[index]
