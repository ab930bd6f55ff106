"""The worker's seccomp filter: which system calls a program may make, and why (stdlib only).

A deny-list on purpose, layered under everything else. The worker runs an unmodified CPython
(later other interpreters from the same launcher) and programs that may use any of the stdlib;
an allow-list would have to follow every call those runtimes and each libc version make on each
architecture, and a call it missed breaks programs in obscure ways. What a deny-list leaves
open is already fenced in: the worker has no capabilities, its own unprivileged uid,
``no_new_privs``, its own mount/network/IPC/UTS namespaces and a private root, so privileged
calls fail anyway. The filter closes what an unprivileged process *can* still reach: kernel
subsystems with a record of exploits (io_uring, bpf, perf, userfaultfd, keyrings, netlink
families other than routing, AF_ALG), other processes (ptrace and friends), leaving the run's
process group or namespaces, the VM host (AF_VSOCK), and -- defence in depth should a
capability ever leak -- the privileged calls Docker's default profile (moby
``profiles/seccomp/default.json``) refuses without the matching capability. In a container the
container runtime's own profile (an allow-list) applies to the workers as well.

Other ABIs (32-bit, x32) are killed: the tables below describe the native one only.

What is refused (answer: calls -- why):

- EPERM: ``setsid``, ``setpgid`` -- a descendant leaving the process group would outlive the
  run.
- EPERM: ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``, ``pidfd_getfd``,
  ``process_madvise`` -- reading, writing or comparing another process's memory or files.
- EPERM: ``unshare``, ``setns``, ``clone`` with namespace flags -- new namespaces (user
  namespaces above all) would re-open what the sandbox closed.
- EPERM: ``clone`` with ``CLONE_PARENT`` -- the child would be the worker's sibling: a child
  of the run's init or the fork server, whose zombies it would leave there.
- ENOSYS: ``clone3`` -- its flags live in memory BPF cannot read; libc falls back to ``clone``.
- EPERM: ``mount``, ``umount2``, ``pivot_root``, ``chroot``, ``open_tree``, ``move_mount``,
  ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``mount_setattr`` -- the private root
  stays as it was built.
- EPERM: ``name_to_handle_at``, ``open_by_handle_at`` -- file handles bypass the path walk
  (the "shocker" container escape).
- ENOSYS: ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register`` -- a large kernel
  attack surface whose queued I/O this filter never sees; libraries fall back to plain calls.
- EPERM: ``bpf``, ``perf_event_open``, ``userfaultfd`` -- kernel attack surface (userfaultfd
  also lets exploits stall the kernel at will).
- EPERM: ``keyctl``, ``add_key``, ``request_key`` -- kernel keyrings are not namespaced.
- EAFNOSUPPORT: ``socket``/``socketpair`` in any domain but AF_UNIX, AF_INET, AF_INET6 and
  AF_NETLINK -- AF_VSOCK reaches the VM host past the network namespace; AF_ALG, AF_PACKET,
  AF_KEY, Bluetooth ... are attack surface no program needs.
- EPROTONOSUPPORT: ``socket(AF_NETLINK)`` but NETLINK_ROUTE -- routing is what libc's
  ``getaddrinfo``/``getifaddrs`` use (it shows only the empty namespace); netfilter, xfrm,
  audit ... are not needed.
- EPERM: ``personality`` but the query and the Linux, 32-bit and uname26 personas (Docker's
  set) -- ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC ... weaken ASLR and W^X of what it executes.
- EPERM, privileged or obsolete (Docker's default refuses them without the capability):
  ``kexec_load``, ``kexec_file_load``, ``init_module``, ``finit_module``, ``delete_module``,
  ``create_module``, ``query_module``, ``get_kernel_syms``, ``reboot``, ``swapon``,
  ``swapoff``, ``acct``, ``quotactl``, ``quotactl_fd``, ``settimeofday``, ``clock_settime``,
  ``clock_adjtime``, ``iopl``, ``ioperm``, ``syslog``, ``vhangup``, ``lookup_dcookie``,
  ``nfsservctl``, ``uselib``, ``ustat``, ``sysfs``, ``_sysctl``, ``fanotify_init``.
- EPERM: ``mbind``, ``set_mempolicy``, ``set_mempolicy_home_node``, ``migrate_pages``,
  ``move_pages`` -- NUMA placement of memory, other tenants' pages included (Docker: only
  with CAP_SYS_NICE).
- EPERM: ``memfd_secret`` -- memory hidden from the kernel itself.

Everything else is allowed: the ordinary process, file, socket, memory, time and signal calls
of the interpreter and the stdlib.
"""

from __future__ import annotations

import errno
import struct

__all__ = ["ARCHES", "DENIED_SYSCALLS", "ENOSYS_SYSCALLS", "SOCKET_DOMAINS", "build"]

# Linux syscall numbers of the native ABI per architecture.
_X86_64 = {
    "setsid": 112, "setpgid": 109, "ptrace": 101, "process_vm_readv": 310,
    "process_vm_writev": 311, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
    "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "bpf": 321,
    "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249,
    "userfaultfd": 323, "open_by_handle_at": 304, "kexec_load": 246, "init_module": 175,
    "clone": 56, "clone3": 435,
    "socket": 41, "socketpair": 53, "personality": 135, "kcmp": 312, "process_madvise": 440,
    "pidfd_getfd": 438, "name_to_handle_at": 303, "iopl": 172, "ioperm": 173, "swapon": 167,
    "swapoff": 168, "reboot": 169, "acct": 163, "settimeofday": 164, "clock_settime": 227,
    "clock_adjtime": 305, "quotactl": 179, "quotactl_fd": 443, "lookup_dcookie": 212,
    "nfsservctl": 180, "mbind": 237, "set_mempolicy": 238, "migrate_pages": 256,
    "move_pages": 279, "set_mempolicy_home_node": 450, "kexec_file_load": 320,
    "finit_module": 313, "delete_module": 176, "create_module": 174, "get_kernel_syms": 177,
    "query_module": 178, "uselib": 134, "ustat": 136, "sysfs": 139, "_sysctl": 156,
    "syslog": 103, "vhangup": 153, "memfd_secret": 447, "fanotify_init": 300,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
}  # fmt: skip
# The generic table (asm-generic/unistd.h), used by aarch64; calls it lacks are left out.
_GENERIC = {
    "setsid": 157, "setpgid": 154, "ptrace": 117, "process_vm_readv": 270,
    "process_vm_writev": 271, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
    "pivot_root": 41, "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "bpf": 280,
    "perf_event_open": 241, "keyctl": 219, "add_key": 217, "request_key": 218,
    "userfaultfd": 282, "open_by_handle_at": 265, "kexec_load": 104, "init_module": 105,
    "clone": 220, "clone3": 435,
    "socket": 198, "socketpair": 199, "personality": 92, "kcmp": 272, "process_madvise": 440,
    "pidfd_getfd": 438, "name_to_handle_at": 264, "swapon": 224, "swapoff": 225,
    "reboot": 142, "acct": 89, "settimeofday": 170, "clock_settime": 112,
    "clock_adjtime": 266, "quotactl": 60, "quotactl_fd": 443, "lookup_dcookie": 18,
    "nfsservctl": 42, "mbind": 235, "set_mempolicy": 237, "migrate_pages": 238,
    "move_pages": 239, "set_mempolicy_home_node": 450, "kexec_file_load": 294,
    "finit_module": 273, "delete_module": 106, "syslog": 116, "vhangup": 58,
    "memfd_secret": 447, "fanotify_init": 262,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
}  # fmt: skip
ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, _X86_64),
    "aarch64": (0xC00000B7, _GENERIC),
}

# Refused with EPERM (see the table above).
DENIED_SYSCALLS = (
    "setsid", "setpgid", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "pidfd_getfd", "process_madvise", "unshare", "setns", "mount", "umount2", "pivot_root",
    "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "name_to_handle_at", "open_by_handle_at", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd",
    "settimeofday", "clock_settime", "clock_adjtime", "iopl", "ioperm", "syslog", "vhangup",
    "lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "fanotify_init",
    "mbind", "set_mempolicy", "set_mempolicy_home_node", "migrate_pages", "move_pages",
    "memfd_secret",
)  # fmt: skip
# Answered ENOSYS, so that libraries fall back to calls the filter can judge.
ENOSYS_SYSCALLS = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")
SOCKET_DOMAINS = {1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK"}
_AF_NETLINK = 16
_NETLINK_ROUTE = 0
_CLONE_PARENT = 0x00008000
# query (0xffffffff), PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32: Docker's set.
PERSONAS = (0xFFFFFFFF, 0x0, 0x8, 0x20000, 0x20008)

_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_NR, _ARCH = 0, 4


def _arg(index: int) -> int:
    """Offset of the low 32 bits of argument ``index`` in ``struct seccomp_data`` (the
    architectures here are little-endian; every argument checked is a 32-bit int)."""
    return 16 + 8 * index


class _Assembler:
    """Classic BPF with named forward jump targets (resolved at the end)."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int | str, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def ret(self, value: int) -> None:
        self.op(_RET, value)

    def assemble(self) -> bytes:
        out = []
        for index, (code, jt, jf, k) in enumerate(self.code):
            offsets = []
            for target in (jt, jf):
                offset = target if isinstance(target, int) else self.labels[target] - index - 1
                if not 0 <= offset <= 255:
                    raise ValueError(f"BPF jump out of range at {index}")
                offsets.append(offset)
            out.append(struct.pack("=HBBI", code, offsets[0], offsets[1], k))
        return b"".join(out)


def build(audit_arch: int, numbers: dict[str, int], namespace_flags: int) -> bytes:
    """The filter for one architecture (``numbers`` is its table in ``ARCHES``)."""
    asm = _Assembler()
    asm.op(_LD, _ARCH)
    asm.op(_JEQ, audit_arch, 1, 0)
    asm.ret(_KILL)
    asm.op(_LD, _NR)
    asm.op(_JGE, 0x40000000, 0, 1)  # the x32 ABI on x86_64 (no such numbers elsewhere)
    asm.ret(_KILL)
    for name in DENIED_SYSCALLS:
        if name in numbers:
            asm.op(_JEQ, numbers[name], "eperm")
    for name in ENOSYS_SYSCALLS:
        if name in numbers:
            asm.op(_JEQ, numbers[name], "enosys")
    asm.op(_JEQ, numbers["clone"], "clone")
    asm.op(_JEQ, numbers["socket"], "socket")
    asm.op(_JEQ, numbers["socketpair"], "socket")
    asm.op(_JEQ, numbers["personality"], "personality")
    asm.ret(_ALLOW)

    asm.label("clone")
    asm.op(_LD, _arg(0))  # clone flags
    # CLONE_PARENT: a child made a sibling of the worker would be reparented outside the
    # run (to its init, or the fork server) and its zombie left on that parent.
    asm.op(_JSET, namespace_flags | _CLONE_PARENT, "eperm")
    asm.ret(_ALLOW)

    asm.label("socket")
    asm.op(_LD, _arg(0))  # domain
    for domain in SOCKET_DOMAINS:
        if domain != _AF_NETLINK:
            asm.op(_JEQ, domain, "allow")
    asm.op(_JEQ, _AF_NETLINK, 0, "eafnosupport")
    asm.op(_LD, _arg(2))  # netlink family (the protocol argument)
    asm.op(_JEQ, _NETLINK_ROUTE, "allow")
    asm.ret(_ERRNO | errno.EPROTONOSUPPORT)

    asm.label("personality")
    asm.op(_LD, _arg(0))
    for persona in PERSONAS:
        asm.op(_JEQ, persona, "allow")

    asm.label("eperm")
    asm.ret(_ERRNO | errno.EPERM)
    asm.label("enosys")
    asm.ret(_ERRNO | errno.ENOSYS)
    asm.label("eafnosupport")
    asm.ret(_ERRNO | errno.EAFNOSUPPORT)
    asm.label("allow")
    asm.ret(_ALLOW)
    return asm.assemble()
