"""The worker's seccomp filter, attacked from a program through `RuntimeService.Run` (real
gRPC, real workers): each refused call answers with the errno ``worker/seccomp.py`` documents,
and what Python and asyncio need still works."""

from __future__ import annotations

import errno
import json
import os
import struct

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2_grpc
from runtime_service.worker import seccomp
from tests.runtime.conftest import drive, start_message

Stub = runtime_pb2_grpc.RuntimeServiceStub
ARCH = os.uname().machine
pytestmark = pytest.mark.skipif(ARCH not in seccomp.ARCHES, reason=f"no syscall table for {ARCH}")
NUMBERS = seccomp.ARCHES.get(ARCH, (0, {}))[1]

# Each attempt: (label, Python expression run in the program). A raw syscall goes through
# ctypes so that nothing in Python's own wrappers can intercept it.
PROBE = """\
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def raw(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
    return errno.errorcode.get(ctypes.get_errno(), "0") if result == -1 else "allowed"
def sock(*args):
    try:
        socket.socket(*args).close()
        return "allowed"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
out = {}
for label, attempt in ATTEMPTS:
    out[label] = eval(attempt)
return out
"""


async def probe(stub: Stub, attempts: list[tuple[str, str]]) -> dict[str, str]:
    program = f"ATTEMPTS = {attempts!r}\n{PROBE}"
    _, terminal = await drive(stub, start_message(program, wall_ms=20_000))
    assert terminal.WhichOneof("outcome") == "success", terminal
    result: dict[str, str] = json.loads(terminal.success.value_json)
    return result


async def test_vsock_and_other_socket_families_are_refused(stub: Stub) -> None:
    result = await probe(
        stub,
        [
            ("vsock-stream", "sock(40, socket.SOCK_STREAM)"),
            ("vsock-dgram", "sock(40, socket.SOCK_DGRAM)"),
            ("alg", "sock(38, socket.SOCK_SEQPACKET)"),
            ("packet", "sock(17, socket.SOCK_RAW)"),
            ("netlink-netfilter", "sock(16, socket.SOCK_RAW, 12)"),
            ("netlink-xfrm", "sock(16, socket.SOCK_RAW, 6)"),
            ("socketpair-vsock", f"raw({NUMBERS['socketpair']}, 40, 1, 0, 0)"),
            # What the stdlib and asyncio need stays open.
            ("unix", "sock(socket.AF_UNIX, socket.SOCK_STREAM)"),
            ("inet", "sock(socket.AF_INET, socket.SOCK_STREAM)"),
            ("inet6", "sock(socket.AF_INET6, socket.SOCK_DGRAM)"),
            ("netlink-route", "sock(16, socket.SOCK_RAW, 0)"),
            ("socketpair", "[s.close() for s in socket.socketpair()] and 'allowed'"),
        ],
    )
    assert result == {
        "vsock-stream": "EAFNOSUPPORT",
        "vsock-dgram": "EAFNOSUPPORT",
        "alg": "EAFNOSUPPORT",
        "packet": "EAFNOSUPPORT",
        "netlink-netfilter": "EPROTONOSUPPORT",
        "netlink-xfrm": "EPROTONOSUPPORT",
        "socketpair-vsock": "EAFNOSUPPORT",
        "unix": "allowed",
        "inet": "allowed",
        "inet6": "allowed",
        "netlink-route": "allowed",
        "socketpair": "allowed",
    }


async def test_io_uring_is_unavailable(stub: Stub) -> None:
    # io_uring_setup(entries, params): a zeroed 120-byte params block is a valid request.
    attempts = [
        (name, f"raw({NUMBERS[name]}, 8, ctypes.addressof(ctypes.create_string_buffer(120)))")
        for name in ("io_uring_setup",)
    ] + [
        (name, f"raw({NUMBERS[name]}, 0, 0, 0, 0)")
        for name in ("io_uring_enter", "io_uring_register")
    ]
    result = await probe(stub, attempts)
    assert result == dict.fromkeys(("io_uring_setup", "io_uring_enter", "io_uring_register"),
                                   "ENOSYS")  # fmt: skip


# Calls that are harmless to attempt with these arguments should the filter let them through
# (they fail on their own, or do nothing): the filter must answer EPERM before the kernel
# looks at them. Where the kernel would answer EPERM itself (no capability), the test could
# not tell the filter from the kernel: those are checked on the BPF program below instead.
NEWLY_REFUSED = [
    ("kcmp", (os.getpid(), os.getpid(), 0, 0, 0)),  # KCMP_FILE 0 0: allowed to self
    ("pidfd_getfd", (-1, 0, 0)),  # EBADF if let through
    ("process_madvise", (-1, 0, 0, 0, 0)),  # EBADF if let through
    ("name_to_handle_at", (-100, 0, 0, 0, 0)),  # EFAULT/EINVAL if let through
    ("mbind", (0, 0, 0, 0, 0, 0)),  # MPOL_DEFAULT over nothing: 0 if let through
    ("set_mempolicy", (0, 0, 0)),  # MPOL_DEFAULT: 0 if let through
    ("migrate_pages", (0, 0, 0, 0)),  # own process, no nodes: 0 if let through
    ("move_pages", (0, 0, 0, 0, 0, 0)),  # no pages: 0 if let through
    ("personality", (0x0040000,)),  # ADDR_NO_RANDOMIZE: allowed to anyone if let through
    ("memfd_secret", (0,)),
    ("quotactl_fd", (-1, 0, 0, 0)),  # EBADF if let through
]


async def test_newly_refused_calls_answer_eperm(stub: Stub) -> None:
    # The worker's own pid is not known here; kcmp's pids are filled in by the program.
    attempts = []
    for name, args in NEWLY_REFUSED:
        if name not in NUMBERS:
            continue
        rendered = ", ".join("os.getpid()" if a == os.getpid() else str(a) for a in args)
        attempts.append((name, f"raw({NUMBERS[name]}, {rendered})"))
    attempts.append(("personality-query", f"raw({NUMBERS['personality']}, 0xffffffff)"))
    result = await probe(stub, attempts)
    expected = {name: "EPERM" for name, _ in attempts}
    expected["personality-query"] = "allowed"
    assert result == expected


def run_filter(program: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate a classic BPF seccomp program on one call (a tiny interpreter for the few
    instructions the builder emits), returning the action value."""
    data = [nr, arch, 0, 0] + [v for a in (args + (0,) * 6)[:6] for v in (a & 0xFFFFFFFF, 0)]
    offsets = {0: 0, 4: 1}
    offsets.update({16 + 8 * i: 4 + 2 * i for i in range(6)})
    acc, pc = 0, 0
    insns = [program[i : i + 8] for i in range(0, len(program), 8)]
    while True:
        code, jt, jf, k = struct.unpack("=HBBI", insns[pc])
        pc += 1
        if code == 0x20:
            acc = data[offsets[k]]
        elif code == 0x06:
            return int(k)
        elif code in (0x15, 0x35, 0x45):
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        else:
            raise AssertionError(f"unexpected BPF opcode {code:#x}")


@pytest.mark.parametrize("arch_name", sorted(seccomp.ARCHES))
def test_every_table_entry_gets_its_documented_answer(arch_name: str) -> None:
    audit, numbers = seccomp.ARCHES[arch_name]
    program = seccomp.build(audit, numbers, 0x7E020000)
    eperm, enosys = 0x50000 | errno.EPERM, 0x50000 | errno.ENOSYS
    for name in seccomp.DENIED_SYSCALLS:
        if name in numbers:
            assert run_filter(program, audit, numbers[name]) == eperm, name
    for name in seccomp.ENOSYS_SYSCALLS:
        assert run_filter(program, audit, numbers[name]) == enosys, name
    assert run_filter(program, audit, numbers["socket"], (40, 1, 0)) == 0x50000 | errno.EAFNOSUPPORT
    assert run_filter(program, audit, numbers["socket"], (2, 1, 0)) == 0x7FFF0000
    assert run_filter(program, audit, numbers["clone"], (0x10000000,)) == eperm
    assert run_filter(program, audit, numbers["clone"], (0x11,)) == 0x7FFF0000  # SIGCHLD fork
    assert run_filter(program, audit + 1, 0) == 0x80000000  # another ABI dies
    allowed = set(range(0, 460)) - {numbers[n] for n in numbers if n not in ("clone",)}
    for nr in sorted(allowed)[:50]:
        assert run_filter(program, audit, nr) == 0x7FFF0000
