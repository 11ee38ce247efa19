"""The child side of a confined run: confine this process, then run what the job says in it.

Started by :mod:`nemo_gym.sandbox.isolation.runner` as ``python -I -B child.py`` with the job
(JSON) on stdin, in a fresh session (its own process group); it first switches to the job's user. It
uses the standard library only and never imports the project: it must work under ``-I`` and
after Landlock has closed the repository.

Before anything untrusted runs, this process applies, in order (each layer when the OS allows it;
:func:`apply_sandbox` reports which took effect):

1. resource limits: CPU seconds, address space, file size, open files, processes, no core dumps;
2. unless the job allows the network, an empty network namespace (``unshare(CLONE_NEWNET)``;
   unprivileged users need a user namespace as well);
3. ``no_new_privs``, then Landlock: writes only beneath the working tree (and ``/dev/null``), reads
   only beneath the listed read roots, no TCP bind/connect without network, and signals and
   abstract unix sockets scoped to this sandbox;
4. a seccomp filter: no sockets without network; no new processes unless the job allows them
   (threads always); no signals outside this process unless processes are allowed (then
   Landlock's signal scoping and the unprivileged user keep them in); no ptrace, mount,
   namespace, ownership or limit changes, io_uring, bpf, modules or clocks; no mode changes
   unless the job allows them (only when the code runs as an unprivileged user).

Where neither the network namespace nor seccomp is available, Python's socket constructors are
replaced by functions that raise (a weaker, in-process block).

Run kinds (``job["run"]["kind"]``):

- ``exec``: run ``argv`` with ``env`` in ``cwd``. This process stays as a small supervisor that
  waits for the command and, when the runner dies (even by SIGKILL), kills the whole group;
  the exit status is the command's (128 + N when signal N killed it).
- ``python``: run the ``main(job)`` function of the harness file ``harness`` in this process
  (its source is read before the layers close the file system); the exit status is what it
  returns. Code that may not start processes runs this way.
- ``probe``: print which layers took effect, as JSON.

Exit status 20 with a line starting ``__NG_SANDBOX__`` on stderr: the sandbox could not be set up.
The runner believes that only from the job's status pipe (``status_fd``): ``R`` once this
process is confined and the command started, ``E<why>`` when it could not be; the pipe is closed
before untrusted code runs, so that code cannot claim a sandbox failure by printing the marker.

One idea: confining this process and running the job in it; one file, because it runs as
``python -I child.py`` and may import nothing beside the standard library (not even a sibling).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import signal
import struct
import sys
from typing import Any

EXIT_SANDBOX_FAILURE = 20
MARKER = "__NG_SANDBOX__"
PR_SET_PDEATHSIG = 1

# --- Linux constants -------------------------------------------------------------------------
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000
EPERM, EAGAIN, EACCES, ENOSYS = 1, 11, 13, 38

# Landlock (syscall numbers are the same on every architecture that has it).
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FS_READ_ACCESS = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FS_FILE_ACCESS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

# seccomp_data offsets: nr at 0, arch at 4, args[i] at 16 + 8 * i (low 32 bits first: little endian).
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06

# What the seccomp filter does per syscall: an errno, or one of the argument checks below.
DENY, SOCKET, CLONE, SELF_SIGNAL, READ_ONLY_PRLIMIT = "deny", "socket", "clone", "self", "prlimit"
_X86_64_RULES: dict[int, tuple[str, int]] = {
    41: (SOCKET, EACCES),  # socket
    56: (CLONE, EAGAIN),  # clone: threads only
    57: (DENY, EAGAIN),  # fork
    58: (DENY, EAGAIN),  # vfork
    435: (DENY, ENOSYS),  # clone3: glibc falls back to clone, where flags can be checked
    62: (SELF_SIGNAL, EPERM),  # kill
    234: (SELF_SIGNAL, EPERM),  # tgkill
    129: (SELF_SIGNAL, EPERM),  # rt_sigqueueinfo
    297: (SELF_SIGNAL, EPERM),  # rt_tgsigqueueinfo
    200: (DENY, EPERM),  # tkill
    424: (DENY, EPERM),  # pidfd_send_signal
    434: (DENY, EPERM),  # pidfd_open
    438: (DENY, EPERM),  # pidfd_getfd
    101: (DENY, EPERM),  # ptrace
    310: (DENY, EPERM),  # process_vm_readv
    311: (DENY, EPERM),  # process_vm_writev
    90: (DENY, EPERM),  # chmod
    91: (DENY, EPERM),  # fchmod
    268: (DENY, EPERM),  # fchmodat
    452: (DENY, EPERM),  # fchmodat2
    92: (DENY, EPERM),  # chown
    93: (DENY, EPERM),  # fchown
    94: (DENY, EPERM),  # lchown
    260: (DENY, EPERM),  # fchownat
    188: (DENY, EPERM),  # setxattr
    189: (DENY, EPERM),  # lsetxattr
    190: (DENY, EPERM),  # fsetxattr
    197: (DENY, EPERM),  # removexattr
    198: (DENY, EPERM),  # lremovexattr
    199: (DENY, EPERM),  # fremovexattr
    165: (DENY, EPERM),  # mount
    166: (DENY, EPERM),  # umount2
    155: (DENY, EPERM),  # pivot_root
    161: (DENY, EPERM),  # chroot
    272: (DENY, EPERM),  # unshare
    308: (DENY, EPERM),  # setns
    428: (DENY, EPERM),  # open_tree
    429: (DENY, EPERM),  # move_mount
    430: (DENY, EPERM),  # fsopen
    431: (DENY, EPERM),  # fsconfig
    432: (DENY, EPERM),  # fsmount
    433: (DENY, EPERM),  # fspick
    442: (DENY, EPERM),  # mount_setattr
    112: (DENY, EPERM),  # setsid
    109: (DENY, EPERM),  # setpgid
    160: (DENY, EPERM),  # setrlimit
    302: (READ_ONLY_PRLIMIT, EPERM),  # prlimit64: reading limits only
    425: (DENY, EPERM),  # io_uring_setup (its requests bypass seccomp)
    426: (DENY, EPERM),  # io_uring_enter
    427: (DENY, EPERM),  # io_uring_register
    321: (DENY, EPERM),  # bpf
    298: (DENY, EPERM),  # perf_event_open
    169: (DENY, EPERM),  # reboot
    246: (DENY, EPERM),  # kexec_load
    320: (DENY, EPERM),  # kexec_file_load
    175: (DENY, EPERM),  # init_module
    313: (DENY, EPERM),  # finit_module
    176: (DENY, EPERM),  # delete_module
    167: (DENY, EPERM),  # swapon
    168: (DENY, EPERM),  # swapoff
    170: (DENY, EPERM),  # sethostname
    171: (DENY, EPERM),  # setdomainname
    164: (DENY, EPERM),  # settimeofday
    227: (DENY, EPERM),  # clock_settime
    159: (DENY, EPERM),  # adjtimex
    305: (DENY, EPERM),  # clock_adjtime
    172: (DENY, EPERM),  # iopl
    173: (DENY, EPERM),  # ioperm
    163: (DENY, EPERM),  # acct
    303: (DENY, EPERM),  # name_to_handle_at
    304: (DENY, EPERM),  # open_by_handle_at
    248: (DENY, EPERM),  # add_key
    249: (DENY, EPERM),  # request_key
    250: (DENY, EPERM),  # keyctl
    323: (DENY, EPERM),  # userfaultfd
}
# aarch64 uses the generic syscall table; only the entries that matter most are listed.
_AARCH64_RULES: dict[int, tuple[str, int]] = {
    198: (SOCKET, EACCES),  # socket
    220: (CLONE, EAGAIN),  # clone
    435: (DENY, ENOSYS),  # clone3
    129: (SELF_SIGNAL, EPERM),  # kill
    131: (SELF_SIGNAL, EPERM),  # tgkill
    130: (DENY, EPERM),  # tkill
    424: (DENY, EPERM),  # pidfd_send_signal
    438: (DENY, EPERM),  # pidfd_getfd
    117: (DENY, EPERM),  # ptrace
    40: (DENY, EPERM),  # mount
    97: (DENY, EPERM),  # unshare
    268: (DENY, EPERM),  # setns
    157: (DENY, EPERM),  # setsid
    154: (DENY, EPERM),  # setpgid
    164: (DENY, EPERM),  # setrlimit
    261: (READ_ONLY_PRLIMIT, EPERM),  # prlimit64
    425: (DENY, EPERM),  # io_uring_setup
    426: (DENY, EPERM),  # io_uring_enter
    427: (DENY, EPERM),  # io_uring_register
}
_RULES = {"x86_64": _X86_64_RULES, "aarch64": _AARCH64_RULES}
# Rules dropped when the job allows processes (fork, exec, signals inside the sandbox) or mode
# changes; the syscall numbers per architecture.
_PROCESS_RULES = {"x86_64": {56, 57, 58, 62, 234, 129, 297}, "aarch64": {220, 129, 131}}
_CHMOD_RULES = {"x86_64": {90, 91, 268, 452}, "aarch64": set()}


class SandboxSetupError(RuntimeError):
    """A sandbox layer that was required could not be applied."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _errno_text() -> str:
    err = ctypes.get_errno()
    return f"{os.strerror(err)} (errno {err})"


# --- layer 1: resource limits ----------------------------------------------------------------
def set_limits(limits: dict[str, Any]) -> None:
    """Apply the rlimits; the hard CPU limit sits one second above the soft one (SIGXCPU first)."""
    cpu_s = max(1, int(limits["cpu_time_s"] + 0.999))
    pairs = [
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
        (resource.RLIMIT_AS, limits["memory_bytes"], limits["memory_bytes"]),
        (resource.RLIMIT_FSIZE, limits["file_size_bytes"], limits["file_size_bytes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if limits.get("processes") is not None:  # None: a pids cgroup counts this sandbox's processes
        pairs.append((resource.RLIMIT_NPROC, limits["processes"], limits["processes"]))
    for which, soft, hard in pairs:
        _, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(which, (soft, hard))


# --- layer 2: network namespace --------------------------------------------------------------
def enter_empty_network_namespace(libc: ctypes.CDLL) -> bool:
    """Move into a new network namespace (loopback only, down). False if the OS refuses."""
    if libc.unshare(CLONE_NEWNET) == 0:
        return True
    # Without CAP_SYS_ADMIN a user namespace makes the network namespace possible.
    return libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0


# --- layer 3: Landlock -----------------------------------------------------------------------
def landlock_abi(libc: ctypes.CDLL) -> int:
    """The kernel's Landlock ABI version (0 when Landlock is missing or disabled)."""
    version = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return int(version) if version > 0 else 0


def apply_landlock(
    libc: ctypes.CDLL,
    workdir: str,
    read_roots: list[str],
    network: bool = False,
    write_roots: tuple[str, ...] = (),
) -> int:
    """Writes beneath ``workdir`` only, reads beneath ``read_roots`` only (no TCP unless
    ``network``); returns the ABI used."""
    abi = landlock_abi(libc)
    if abi < 1:
        return 0
    write_access = (
        FS_WRITE_FILE
        | FS_REMOVE_DIR
        | FS_REMOVE_FILE
        | FS_MAKE_CHAR
        | FS_MAKE_DIR
        | FS_MAKE_REG
        | FS_MAKE_SOCK
        | FS_MAKE_FIFO
        | FS_MAKE_BLOCK
        | FS_MAKE_SYM
    )
    if abi >= 2:
        write_access |= FS_REFER
    if abi >= 3:
        write_access |= FS_TRUNCATE
    if abi >= 5:
        write_access |= FS_IOCTL_DEV
    handled_fs = write_access | FS_READ_ACCESS
    handled_net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 and not network else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    # A larger struct with zeroed unknown fields is accepted by older kernels.
    attr = struct.pack("QQQ", handled_fs, handled_net, scoped)
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, attr, len(attr), 0)
    if ruleset < 0:
        raise SandboxSetupError(f"landlock_create_ruleset failed: {_errno_text()}")
    try:
        # Mask with what was handled: a rule may not grant rights the ruleset does not handle.
        # Extra write roots are directories of the tree seen through a bind mount (a private /tmp):
        # Landlock walks the path it is reached by, which passes their inode, not the tree's.
        rules = [
            (path, (write_access | FS_READ_ACCESS) & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK))
            for path in (workdir, *write_roots)
        ]
        rules.append(("/dev/null", FS_WRITE_FILE | FS_READ_FILE | (FS_TRUNCATE if abi >= 3 else 0)))
        rules += [(root, FS_READ_ACCESS) for root in read_roots]
        for path, access in rules:
            _add_landlock_rule(libc, ruleset, path, access & handled_fs)
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise SandboxSetupError(f"landlock_restrict_self failed: {_errno_text()}")
    finally:
        os.close(ruleset)
    return abi


def _add_landlock_rule(libc: ctypes.CDLL, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a read root that does not exist on this machine: nothing to allow
    try:
        if not os.path.isdir(path):
            access &= FS_FILE_ACCESS
        rule = struct.pack("=Qi", access, fd)  # struct landlock_path_beneath_attr is packed
        if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0) != 0:
            raise SandboxSetupError(f"landlock_add_rule({path!r}) failed: {_errno_text()}")
    finally:
        os.close(fd)


# --- layer 4: seccomp ------------------------------------------------------------------------
def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def build_seccomp_filter(
    machine: str, pid: int, *, network: bool = False, processes: bool = False, chmod: bool = False
) -> bytes:
    """A classic-BPF seccomp program for ``machine`` (see the module docstring for the policy)."""
    dropped = (_PROCESS_RULES[machine] if processes else set()) | (_CHMOD_RULES[machine] if chmod else set())
    allow = SECCOMP_RET_ALLOW
    program = [
        _insn(BPF_LD_W_ABS, 0, 0, 4),
        _insn(BPF_JEQ_K, 1, 0, AUDIT_ARCH[machine]),
        _insn(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        _insn(BPF_LD_W_ABS, 0, 0, 0),
    ]
    if machine == "x86_64":  # the x32 ABI would bypass every rule below
        program += [_insn(BPF_JGE_K, 0, 1, 0x40000000), _insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS)]
    for number, (kind, errno) in _RULES[machine].items():
        if number in dropped or (kind == SOCKET and network):
            continue
        deny = SECCOMP_RET_ERRNO | errno
        if kind in (DENY, SOCKET):
            # No socket at all: socketpair stays allowed (asyncio needs it, it reaches nothing).
            handler = [_insn(BPF_RET_K, 0, 0, deny)]
        elif kind == CLONE:
            handler = [
                _insn(BPF_LD_W_ABS, 0, 0, 16),
                _insn(BPF_JSET_K, 0, 1, CLONE_THREAD),
                _insn(BPF_RET_K, 0, 0, allow),
                _insn(BPF_RET_K, 0, 0, deny),
            ]
        elif kind == SELF_SIGNAL:
            # Allowed targets: this process, its own group (0 or -pid).
            handler = [
                _insn(BPF_LD_W_ABS, 0, 0, 16),
                _insn(BPF_JEQ_K, 3, 0, pid),
                _insn(BPF_JEQ_K, 2, 0, 0),
                _insn(BPF_JEQ_K, 1, 0, -pid),
                _insn(BPF_RET_K, 0, 0, deny),
                _insn(BPF_RET_K, 0, 0, allow),
            ]
        else:  # READ_ONLY_PRLIMIT: prlimit64(pid, resource, new_limit, old_limit) with new_limit NULL
            handler = [
                _insn(BPF_LD_W_ABS, 0, 0, 32),
                _insn(BPF_JEQ_K, 0, 3, 0),
                _insn(BPF_LD_W_ABS, 0, 0, 36),
                _insn(BPF_JEQ_K, 0, 1, 0),
                _insn(BPF_RET_K, 0, 0, allow),
                _insn(BPF_RET_K, 0, 0, deny),
            ]
        # Every handler returns, so the chain only continues after a failed match, with the
        # syscall number still in the accumulator.
        program.append(_insn(BPF_JEQ_K, 0, len(handler), number))
        program += handler
    program.append(_insn(BPF_RET_K, 0, 0, allow))
    return b"".join(program)


def apply_seccomp(
    libc: ctypes.CDLL, *, network: bool = False, processes: bool = False, chmod: bool = False
) -> bool:
    """Install the seccomp filter (needs ``no_new_privs`` set first). False if unsupported here."""
    machine = platform.machine()
    if machine not in _RULES:
        return False
    code = build_seccomp_filter(machine, os.getpid(), network=network, processes=processes, chmod=chmod)
    count = len(code) // 8
    buffer = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(count, ctypes.cast(buffer, ctypes.c_void_p))
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        return False
    return True


def block_python_sockets() -> None:
    """In-process fallback: socket constructors raise. Untrusted code can get around this."""
    import _socket
    import socket

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(EACCES, "network access is disabled in this sandbox")

    for module in (socket, _socket):
        for name in ("socket", "create_connection", "create_server", "fromfd", "socketpair"):
            if hasattr(module, name):
                setattr(module, name, refuse)


def apply_sandbox(job: dict[str, Any]) -> dict[str, Any]:
    """Apply every layer the OS allows; returns which took effect (raises if a required one fails)."""
    layers: dict[str, Any] = {"rlimits": False, "netns": False, "landlock_abi": 0, "seccomp": False}
    network = bool(job.get("network", False))
    set_limits(job["limits"])
    layers["rlimits"] = True
    if not sys.platform.startswith("linux"):
        if not network:
            block_python_sockets()
            layers["python_socket_block"] = True
        _check_required(job, layers)
        return layers
    libc = _libc()
    if job.get("use_netns", True) and not network:
        layers["netns"] = enter_empty_network_namespace(libc)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    no_new_privs = libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    if no_new_privs and job.get("use_landlock", True):
        layers["landlock_abi"] = apply_landlock(
            libc, job["workdir"], job.get("read_roots") or ["/"], network, tuple(job.get("write_roots") or ())
        )
    if no_new_privs and job.get("use_seccomp", True):
        layers["seccomp"] = apply_seccomp(
            libc,
            network=network,
            processes=bool(job.get("allow_processes", False)),
            chmod=bool(job.get("allow_chmod", False)),
        )
    if not network and not layers["seccomp"] and not layers["netns"]:
        block_python_sockets()
        layers["python_socket_block"] = True
    _check_required(job, layers)
    return layers


def _check_required(job: dict[str, Any], layers: dict[str, Any]) -> None:
    for required in job.get("require") or []:
        if not layers.get(required):
            raise SandboxSetupError(f"required sandbox layer {required!r} is not available here")


def _report(message: str) -> None:
    try:
        os.write(2, f"\n{MARKER} {message}\n".encode(errors="replace"))
    except OSError:
        pass


def _tell_runner(job: dict[str, Any], message: str) -> None:
    """Say on the job's status pipe that this sandbox is confined (``R``) or failed (``E why``),
    then close it. Untrusted code never holds that pipe (it is closed before anything runs), so
    only the sandbox itself can claim a failure of its own: a command that prints the marker and
    exits 20 is a command that exited 20."""
    fd = job.get("status_fd")
    if fd is None:
        return
    job["status_fd"] = None
    try:
        os.write(fd, message.encode(errors="replace")[:4000])
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def _read_job() -> dict[str, Any]:
    chunks = []
    while chunk := os.read(0, 1 << 20):
        chunks.append(chunk)
    job: dict[str, Any] = json.loads(b"".join(chunks))
    if job.get("status_fd") is not None:
        os.set_inheritable(job["status_fd"], False)  # the command never gets it
    try:
        _prepare_process(job)
    except OSError as exc:
        raise _JobError(job, str(exc)) from None
    return job


class _JobError(OSError):
    """Setting up from a job that was read failed (the job says where to report it)."""

    def __init__(self, job: dict[str, Any], message: str) -> None:
        super().__init__(message)
        self.job = job


def _prepare_process(job: dict[str, Any]) -> None:
    """Join the cgroup, make the private /tmp, switch user, and put the job's stdin in place."""
    if job.get("cgroup"):
        join_cgroup(job["cgroup"])
    if job.get("private_tmp"):
        layers_private_tmp(job["private_tmp"])
    if job.get("run_as"):
        uid, gid = job["run_as"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    # The job came on stdin; what the code reads there is the job's stdin file (or nothing).
    fd = os.open(job.get("stdin_path") or os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)


def join_cgroup(path: str) -> None:
    """Move this process (and so everything it starts) into the sandbox's pids cgroup, while it
    still has the privileges to (before switching user)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        raise OSError(exc.errno, f"joining the sandbox's pids cgroup {path} failed: {exc.strerror}") from None


def layers_private_tmp(source: str) -> None:
    """Give this process (and what it starts) its own ``/tmp``: ``source`` bind-mounted there in a
    new, private mount namespace (needs CAP_SYS_ADMIN: the runner asks only when it is root)."""
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), f"unshare(CLONE_NEWNS) failed: {_errno_text()}")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), f"making mounts private failed: {_errno_text()}")
    if libc.mount(source.encode(), b"/tmp", None, MS_BIND | MS_REC, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind-mounting the private /tmp failed: {_errno_text()}")


def _die_with_parent(parent_pid: int, how: int) -> None:
    """Deliver ``how`` to this process when the runner dies; if it already has, exit now."""
    if sys.platform.startswith("linux"):
        libc = _libc()
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        libc.prctl(PR_SET_PDEATHSIG, how, 0, 0, 0)
    if parent_pid and os.getppid() != parent_pid:
        os._exit(EXIT_SANDBOX_FAILURE)


def _supervise(job: dict[str, Any], run: dict[str, Any]) -> int:
    """Start the command as a child in this group; wait for it; kill the group if the runner dies."""

    def kill_group(signum: int, frame: Any) -> None:
        os.killpg(0, signal.SIGKILL)  # ends the command, what it started, and this supervisor

    signal.signal(signal.SIGTERM, kill_group)
    try:
        pid = os.fork()
    except OSError as exc:
        # The sandbox's own failure (its process limit is used up, the machine is out of
        # processes), not the command's: the runner reports it as such, never as an exit status.
        message = f"could not start the command: fork refused ({exc.strerror})"
        _report(f"sandbox setup failed: {message}")
        _tell_runner(job, f"E{message}")
        return EXIT_SANDBOX_FAILURE
    if pid:
        _tell_runner(job, "R")
    if pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.chdir(run["cwd"])
            os.execve(run["argv"][0], run["argv"], run["env"])
        except BaseException as exc:  # noqa: BLE001 - report any failure to start, then exit
            _report(f"could not start {run['argv'][0]!r}: {exc}")
        os._exit(127)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main() -> int:
    """Read the job, confine this process, run it; returns the exit status."""
    try:
        job = _read_job()
    except _JobError as exc:
        _report(f"sandbox setup failed: {exc}")
        _tell_runner(exc.job, f"E{exc}")
        return EXIT_SANDBOX_FAILURE
    except (OSError, ValueError) as exc:
        _report(f"sandbox setup failed: {exc}")
        return EXIT_SANDBOX_FAILURE
    run = job["run"]
    harness = None
    if run["kind"] == "python":
        with open(run["harness"], encoding="utf-8") as f:
            harness = compile(f.read(), run["harness"], "exec")
    # The supervisor is told by SIGTERM (it then kills the group); code running in this very
    # process is simply killed.
    _die_with_parent(
        int(job.get("parent_pid") or 0), signal.SIGTERM if run["kind"] == "exec" else signal.SIGKILL
    )
    try:
        layers = apply_sandbox(job)
    except (SandboxSetupError, OSError, ValueError) as exc:
        _report(f"sandbox setup failed: {exc}")
        _tell_runner(job, f"E{exc}")
        return EXIT_SANDBOX_FAILURE
    if run["kind"] == "probe":
        _tell_runner(job, "R")
        print(json.dumps(layers), flush=True)
        return 0
    if run["kind"] == "exec":
        return _supervise(job, run)
    _tell_runner(job, "R")  # from here on, whatever happens is the code's doing
    assert harness is not None
    namespace: dict[str, Any] = {"__name__": "__ng_harness__"}
    exec(harness, namespace)
    status: int = namespace["main"](job)
    return status


if __name__ == "__main__":
    # os._exit: skip interpreter teardown, which the code may have left in any state.
    os._exit(main())
