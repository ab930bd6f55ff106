"""`codemode_common.procfs`: the one reader of /proc the runtime, the load test, the benchmarks
and the tests share, checked against what the kernel says through other calls."""

from __future__ import annotations

import os
import subprocess
import sys

from codemode_common import procfs


def test_a_process_reads_as_the_kernel_says_through_other_calls() -> None:
    me = procfs.stat(os.getpid())
    assert me is not None
    assert me.pid == os.getpid() and me.ppid == os.getppid()
    assert me.pgid == os.getpgid(0) and me.sid == os.getsid(0)
    assert not me.ended and me.state in (b"R", b"S")
    assert int(me.start_ticks) > 0
    assert me.cpu_ticks(reaped=True) >= me.cpu_ticks()
    ids = procfs.ids(os.getpid())
    assert ids is not None and not ids.ended
    assert os.getuid() in ids.uids and os.getgid() in ids.gids
    argv = [os.fsencode(arg) for arg in sys.orig_argv]  # as exec'd: `python -m pytest`...
    assert (procfs.cmdline(os.getpid()) or b"").split(b"\0")[:-1] == argv
    assert os.getpid() in {found.pid for found in procfs.scan()}
    assert procfs.machine_busy_s() is not None


def test_a_name_with_spaces_and_parentheses_is_cut_at_the_last_parenthesis() -> None:
    name = "a (b) c"
    child = subprocess.Popen(
        [sys.executable, "-c", f"import ctypes, sys; ctypes.CDLL(None).prctl(15, {name!r}.encode())"
         "; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        found = procfs.stat(child.pid)
        assert found is not None and found.name == name.encode()
        assert found.ppid == os.getpid() and not found.ended
        assert child.pid in procfs.children(os.getpid(), ended=False)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


def test_a_zombie_is_ended_and_a_reaped_process_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # Waited for without reaping: from here on it is a zombie until reaped below.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    found = procfs.stat(child.pid)
    assert found is not None and found.ended and found.state == b"Z"
    assert child.pid in procfs.children(os.getpid(), ended=True)
    assert child.pid not in procfs.children(os.getpid(), ended=False)
    ids = procfs.ids(child.pid)
    assert ids is not None and ids.ended
    assert procfs.cmdline(child.pid) == b""
    child.wait()
    assert procfs.stat(child.pid) is None
    assert procfs.ids(child.pid) is None
    assert procfs.cmdline(child.pid) is None
    assert procfs.cpu_s(child.pid) is None
    assert child.pid not in procfs.children(os.getpid())
