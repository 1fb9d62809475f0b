"""The program a `Workspace.run_python` child runs before the agent's file (never imported to run).

`workspace.py` passes this file's text as `python -I -B -c <text> MEM CPU FSIZE FILE ARGS...`
with the workspace as the working directory. `main()`, in order:
1. resource limits: address space MEM, CPU seconds CPU, file size FSIZE, no core files;
2. `enter_network_namespace`: a fresh network namespace (only a downed loopback) where the
   kernel allows one;
3. `restrict_files` (Landlock, where the kernel has it): the kernel refuses this process and
   anything it starts every file access but reading the standard library and the system's
   shared libraries (for the loader), and reading and writing the workspace; it refuses
   executing any file, making device nodes, TCP bind/connect (Landlock ABI >= 4) and signals
   or abstract unix sockets reaching processes outside the sandbox (ABI >= 6);
4. `install_process_filter` (seccomp): the kernel refuses this process every way of making
   another one: `fork`, `vfork`, `clone` without `CLONE_THREAD` (threads still work) and
   `execve`/`execveat` fail with EPERM, `clone3` with ENOSYS (so the C library falls back to
   `clone`, which the filter can inspect); a system call of another ABI (x32, or a foreign
   architecture) kills the process. So whatever the agent's code does, even native code or
   `_posixsubprocess` loaded under another name, the run is one process: the time-limit kill
   ends all of it and RLIMIT_AS bounds all of its memory. A kernel without seccomp, or an
   architecture without a table here, makes the run fail (never run unconfined).
   Then `_posixsubprocess.fork_exec` (which starts a process without an audit event) is
   replaced by a refusal, for a clear error;
5. `install_guard`: an audit hook, the layer that holds where Landlock is missing and that
   gives the clear error (`PermissionError("sandbox: ...")`) where both hold:
   - `open`/`os.open`: reading only inside the workspace, the standard library (not its
     site-packages) and /dev/null, /dev/urandom; directories only inside the workspace (so
     any `dir_fd` is a workspace directory); writing only inside the workspace and /dev/null;
     no device files (a block device made with `os.mknod` would be the raw disk). Paths are
     resolved (symlinks, `..`) with functions bound before the agent's code runs; `sqlite3`
     databases only in memory or inside the workspace;
   - `os.remove/unlink/rmdir/mkdir/rename/replace/link/chmod/chown/utime/truncate/
     setxattr/removexattr/chdir`: only inside the workspace (fd and `dir_fd` arguments
     resolved through /proc/self/fd); `os.symlink`: the link inside the workspace, its target
     without `..` and, if absolute, inside the workspace (so no link can point outside however
     its directory is moved); listing directories only where reading is allowed;
   - refused outright: sockets (connect, bind, sendto, sendmsg, getaddrinfo), starting
     processes, `os.kill/killpg`, `signal.pthread_kill`, `ctypes` (dlopen, dlsym, foreign
     calls, raw memory), `resource.setrlimit/prlimit`, `gc.get_objects/get_referrers/
     get_referents`, new interpreters, loading a native module from outside the standard
     library, and importing the modules that open files or start processes in C without an
     audit event (`_tkinter`, `readline`, dbm, `syslog`, ...) or re-create `_posixsubprocess`;
6. `sys.path` becomes the workspace and the standard library; the file runs as `__main__`.

The hook looks up no global or builtin name at call time (everything is bound in
`install_guard`), so a program that edits `builtins`, `os` or this module's globals (reachable
through frames) does not change it. Audit hooks stop Python code, not native code or attacks
on the interpreter itself (PEP 578); an escape of that kind still meets Landlock and the
network namespace where the kernel has them (`workspace.sandbox_layers()` says which hold).
Not covered by the hook: a few functions raise no audit event (`signal.pidfd_send_signal`,
`os.chroot`, `os.mknod`: Landlock refuses signals out at ABI >= 6 and device nodes always, and
the hook refuses to open device files); `os.open(name, dir_fd=fd)` is checked as if `name`
were relative to the working directory (the event does not carry `dir_fd`; `fd` can only be a
workspace directory, but a `name` with `..` may then resolve differently); a check and the
system call it guards are two steps, so a thread that swaps directories between them is not
covered.
"""

import ctypes
import os
import pkgutil  # noqa: F401  (runpy.run_path imports it: loaded before the hook is cheaper)
import posix
import resource
import runpy
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_THREAD = 0x00010000

# seccomp (include/uapi/linux/seccomp.h, filter.h). Per architecture: the AUDIT_ARCH value and
# the numbers of the calls that make processes (arm64 has no fork/vfork: glibc uses clone).
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO = 0x80000000, 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
EPERM, ENOSYS = 1, 38
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_DATA_NR, SECCOMP_DATA_ARCH, SECCOMP_DATA_ARG0 = 0, 4, 16  # little-endian low word
X32_SYSCALL_BIT = 0x40000000
PROCESS_SYSCALLS = {  # machine -> (audit arch, refused with EPERM, clone, clone3)
    "x86_64": (0xC000003E, (57, 58, 59, 322), 56, 435),  # fork vfork execve execveat
    "aarch64": (0xC00000B7, (221, 281), 220, 435),  # execve execveat
}

# Landlock (include/uapi/linux/landlock.h). The syscall numbers are those of the unified
# table (x86-64, arm64 and every architecture but alpha).
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_MAKE_CHAR, FS_MAKE_BLOCK = 1 << 6, 1 << 11
FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
FS_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
# Where the dynamic loader finds the libraries of standard-library extension modules.
LOADER_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
LOADER_FILES = ("/etc/ld.so.cache",)

REFUSED = frozenset({
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function",
    "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr",
    "resource.setrlimit", "resource.prlimit", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "cpython.PyInterpreterState_New", "sqlite3.enable_load_extension",
    "sqlite3.load_extension"})
# Modules that, once the hook is in, could only re-create what step 4 removed, reach the
# interpreter's internals, or open files and start processes in C without an audit event
# (Tcl's `open`/`exec`, readline's history files, dbm files, syslog's socket).
REFUSED_MODULES = frozenset({
    "_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels", "_testcapi",
    "_testinternalcapi", "_testmultiphase", "_testsinglephase", "_testimportmultiple",
    "_testbuffer", "_testclinic", "_ctypes_test", "_tkinter", "readline", "_dbm", "_gdbm",
    "syslog", "spwd", "nis", "ossaudiodev"})
# event -> ((path argument, dir_fd argument or -1, follow the last symlink), ...)
ENTRY_EVENTS = {
    "os.remove": ((0, 1, False),), "os.rmdir": ((0, 1, False),), "os.mkdir": ((0, 2, False),),
    "os.rename": ((0, 2, False), (1, 3, False)), "os.link": ((0, 2, True), (1, 3, False)),
    "os.chmod": ((0, 2, True),), "os.chown": ((0, 3, True),), "os.utime": ((0, 3, True),),
    "os.truncate": ((0, -1, True),), "os.setxattr": ((0, -1, True),),
    "os.removexattr": ((0, -1, True),), "os.chdir": ((0, -1, True),),
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
READABLE_DEVICES = ("/dev/null", "/dev/urandom")
WRITABLE_DEVICES = ("/dev/null",)


def set_limits(mem: int, cpu: int, fsize: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _syscall(libc):
    fn = libc.syscall
    fn.restype = ctypes.c_long
    return fn


def enter_network_namespace(libc) -> bool:
    """Unshares the network namespace (as root, else in a new user namespace); True if done."""
    return libc.unshare(CLONE_NEWNET) == 0 or libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi(libc) -> int:
    """The kernel's Landlock ABI version (0 when it has none or it is disabled)."""
    abi = _syscall(libc)(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                         ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


def stdlib_dirs() -> tuple[str, ...]:
    """The standard library's directories (pure Python, extension modules, zipped)."""
    dirs = [os.path.dirname(os.path.realpath(os.__file__))]
    for p in sys.path:
        if os.path.basename(p) == "lib-dynload" or p.endswith(".zip"):
            dirs.append(os.path.realpath(p))
    return tuple(dict.fromkeys(dirs))


def restrict_files(libc, root: str, reads: tuple[str, ...]) -> int:
    """Landlock step 3 of the module docstring; returns the ABI used (0: not available)."""
    abi = landlock_abi(libc)
    if abi < 1:
        return 0
    fs = FS_ABI1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0) \
        | (FS_IOCTL_DEV if abi >= 5 else 0)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(fs, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    syscall = _syscall(libc)
    ruleset = syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                      ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read = FS_READ_FILE | FS_READ_DIR
    rules = [(root, fs & ~(FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_BLOCK | FS_IOCTL_DEV))]
    rules += [(d, read) for d in reads + LOADER_DIRS]
    rules += [(f, FS_READ_FILE) for f in LOADER_FILES + READABLE_DEVICES]
    rules += [(f, FS_WRITE_FILE | FS_TRUNCATE) for f in WRITABLE_DEVICES]
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # e.g. no /lib64 here
        try:
            if not os.path.isdir(path):
                access &= FS_FILE_ONLY
            rule = _PathBeneath(access & fs, fd)
            if syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                       ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule),
                       ctypes.c_uint32(0)) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule {path!r} failed")
        finally:
            os.close(fd)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(ruleset)
    return abi


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def process_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """The BPF program of step 4 as (code, jt, jf, k) rows; jumps are relative, as BPF's."""
    if machine not in PROCESS_SYSCALLS:
        raise OSError(f"sandbox: no process filter for architecture {machine!r}")
    arch, refused, clone, clone3 = PROCESS_SYSCALLS[machine]
    errno_ret = SECCOMP_RET_ERRNO | EPERM
    # Layout: checks, then the shared returns at the end; a check jumps to them by label.
    body: list[tuple[int, object, object, int]] = [
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        (BPF_JEQ_K, 0, "kill", arch),
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        (BPF_JGE_K, "deny", 0, X32_SYSCALL_BIT),
        *[(BPF_JEQ_K, "deny", 0, nr) for nr in refused],
        (BPF_JEQ_K, "nosys", 0, clone3),
        (BPF_JEQ_K, 0, "allow", clone),
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0),
        (BPF_JSET_K, "allow", "deny", CLONE_THREAD),
    ]
    returns = {"allow": SECCOMP_RET_ALLOW, "deny": errno_ret,
               "nosys": SECCOMP_RET_ERRNO | ENOSYS, "kill": SECCOMP_RET_KILL_PROCESS}
    at = {name: len(body) + i for i, name in enumerate(returns)}
    rows = [(code, jt if isinstance(jt, int) else at[jt] - i - 1,
             jf if isinstance(jf, int) else at[jf] - i - 1, k)
            for i, (code, jt, jf, k) in enumerate(body)]
    return rows + [(BPF_RET_K, 0, 0, k) for k in returns.values()]


def install_process_filter(libc) -> bool:
    """Step 4 of the module docstring: no new processes, by the kernel; True when installed."""
    rows = process_filter(os.uname().machine)
    prog = (_SockFilter * len(rows))(*[_SockFilter(*r) for r in rows])
    fprog = _SockFprog(len(rows), ctypes.cast(prog, ctypes.POINTER(_SockFilter)))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: cannot install the process filter")
    return True


def _no_fork_exec(*args, **kwargs):
    raise PermissionError("sandbox: starting processes is not allowed")


def install_guard(root: str, reads: tuple[str, ...]) -> None:
    """Adds the audit hook of step 5 of the module docstring."""
    # Bound now: the hook below reads only these (closure cells), never a global or builtin.
    lstat, stat, readlink, getcwd = posix.lstat, posix.stat, posix.readlink, posix.getcwd
    as_str, decode, int_repr = str.__str__, bytes.decode, int.__repr__
    is_a, str_, bytes_, int_ = isinstance, str, bytes, int
    deny, oserror = PermissionError, OSError
    encoding = sys.getfilesystemencoding()
    refused, refused_modules, entries = REFUSED, REFUSED_MODULES, ENTRY_EVENTS
    write_flags, readable_devices, writable_devices = (
        WRITE_FLAGS, READABLE_DEVICES, WRITABLE_DEVICES)
    excluded = tuple(d + "/" + sub for d in reads for sub in ("site-packages", "dist-packages"))
    root_prefix = root + "/"
    watched = refused | frozenset(entries) | {"open", "os.symlink", "os.listdir", "os.scandir",
                                              "import", "sqlite3.connect"}

    def text(p):
        """A path argument as an exact str (no method of a str subclass runs), or None."""
        if is_a(p, str_):
            return as_str(p)
        if is_a(p, bytes_):
            return decode(p, encoding, "surrogateescape")
        return None

    def fd_path(fd):
        try:
            return readlink("/proc/self/fd/" + int_repr(fd))
        except oserror:
            raise deny(f"sandbox: cannot tell where descriptor {int_repr(fd)} points") from None

    def real(path, base, follow):
        """`path` (relative to `base`) with `.`, `..` and symlinks resolved."""
        if not follow:
            head, _, tail = path.rpartition("/")
            if tail not in ("", ".", ".."):
                if head == "" and path.startswith("/"):
                    head = "/"
                parent = real(head, base, True) if head else real(".", base, True)
                return parent.rstrip("/") + "/" + tail
        if not path.startswith("/"):
            path = base + "/" + path
        todo = path.split("/")
        todo.reverse()
        out = []
        hops = 0
        while todo:
            part = todo.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                if out:
                    out.pop()
                continue
            out.append(part)
            here = "/" + "/".join(out)
            try:
                mode = lstat(here).st_mode
            except oserror:
                continue
            if mode & 0o170000 == 0o120000:
                hops += 1
                if hops > 40:
                    raise deny(f"sandbox: too many symbolic links in {path!r}")
                out.pop()
                target = readlink(here)
                if target.startswith("/"):
                    out.clear()
                parts = target.split("/")
                parts.reverse()
                todo += parts
        return "/" + "/".join(out)

    def inside(r):
        return r == root or r.startswith(root_prefix)

    def in_reads(r):
        for d in excluded:
            if r == d or r.startswith(d + "/"):
                return False
        for d in reads:
            if r == d or r.startswith(d + "/"):
                return True
        return False

    def file_type(r):
        try:
            return stat(r).st_mode & 0o170000
        except oserror:
            return -1

    def is_dir(r):
        return file_type(r) == 0o040000

    def is_device(r):
        return file_type(r) in (0o020000, 0o060000)

    def resolve(arg, dir_fd, follow, what):
        if is_a(arg, int_):
            return fd_path(arg)
        p = text(arg)
        if p is None:
            raise deny(f"sandbox: {what}: unexpected path argument")
        if p.startswith("/"):
            base = "/"
        elif is_a(dir_fd, int_) and dir_fd >= 0:
            base = fd_path(dir_fd)
        else:
            base = getcwd()
        return real(p, base, follow)

    def check_open(path, mode, flags):
        if is_a(path, int_):
            return  # wraps a descriptor the program already holds
        p = text(path)
        if p is None:
            raise deny("sandbox: open: unexpected path argument")
        m = as_str(mode) if is_a(mode, str_) else ""
        write = (is_a(flags, int_) and flags & write_flags) or "w" in m or "a" in m \
            or "x" in m or "+" in m
        r = real(p, getcwd(), True)
        if inside(r):
            if is_device(r):  # e.g. a block device made with os.mknod: the raw disk
                raise deny(f"sandbox: opening device {p!r} is not allowed")
            return
        if write:
            if r not in writable_devices:
                raise deny(f"sandbox: writing {p!r} is not allowed (outside the workspace)")
        elif not (r in readable_devices or (in_reads(r) and not is_dir(r))):
            raise deny(f"sandbox: reading {p!r} is not allowed (outside the workspace)")

    def check_symlink(target, link, dir_fd):
        if not inside(resolve(link, dir_fd, False, "os.symlink")):
            raise deny("sandbox: os.symlink: the link must be inside the workspace")
        t = text(target)
        if t is None or ".." in t.split("/"):
            raise deny("sandbox: os.symlink: a link target may not contain '..'")
        if t.startswith("/") and not inside(real(t, "/", True)):
            raise deny(f"sandbox: os.symlink: target {t!r} is outside the workspace")

    def hook(event, args):
        if event not in watched:  # most events (attribute access, exec, compile, ...)
            return
        if event == "open":
            check_open(args[0], args[1], args[2])
        elif event in entries:
            for i, j, follow in entries[event]:
                if not inside(resolve(args[i], args[j] if j >= 0 else -1, follow, event)):
                    raise deny(f"sandbox: {event} outside the workspace is not allowed")
        elif event == "os.symlink":
            check_symlink(args[0], args[1], args[2])
        elif event == "os.listdir" or event == "os.scandir":
            r = resolve(args[0], -1, True, event) if args[0] is not None else getcwd()
            if not (inside(r) or in_reads(r)):
                raise deny(f"sandbox: {event} outside the workspace is not allowed")
        elif event == "sqlite3.connect":
            db = text(args[0])
            if db not in ("", ":memory:") and (db is None or db.startswith("file:") or not
                                               inside(resolve(db, -1, True, event))):
                raise deny(f"sandbox: {event} outside the workspace is not allowed")
        elif event in refused:
            raise deny(f"sandbox: {event} is not allowed")
        elif event == "import":
            name = text(args[0])
            if name in refused_modules:
                raise deny(f"sandbox: importing {name} is not allowed")
            if args[1] is not None:  # a native module being loaded from this file
                r = resolve(args[1], -1, True, event)
                if not in_reads(r):
                    raise deny(f"sandbox: loading native module {name} from {r!r} is not "
                               "allowed (only the standard library's)")

    sys.addaudithook(hook)


def main() -> None:
    mem, cpu, fsize = (int(a) for a in sys.argv[1:4])
    set_limits(mem, cpu, fsize)
    libc = ctypes.CDLL(None, use_errno=True)
    enter_network_namespace(libc)
    root = os.getcwd()
    reads = stdlib_dirs()
    restrict_files(libc, root, reads)
    install_process_filter(libc)
    del libc
    import _posixsubprocess

    _posixsubprocess.fork_exec = _no_fork_exec
    install_guard(root, reads)
    path = sys.argv[4]
    sys.argv = sys.argv[4:]
    sys.path[:] = ["."] + [p for p in sys.path if any(
        os.path.realpath(p) == d or os.path.realpath(p).startswith(d + "/") for d in reads)]
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main()
