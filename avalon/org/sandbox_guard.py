"""The legacy layers of the sandbox, for machines where bubblewrap cannot run (prepended to
`sandbox_boot.py`'s text when `avalon/org/sandbox.py` falls back; never imported to run).

Without bubblewrap there is no mount, PID or user namespace: the program runs as the trainer's
user, beside the trainer, on the real workspace. What is left, and said once at start-up:
- a fresh network namespace where the kernel allows one (`enter_network_namespace`);
- Landlock where the kernel has it (`restrict_files`): every file access is refused but
  reading the standard library and the system's shared libraries, and reading and writing the
  workspace; executing files, making device nodes, TCP bind/connect (ABI >= 4), and signals or
  abstract unix sockets reaching processes outside (ABI >= 6);
- the audit hook (`install_guard`): Python-level checks of files, processes, sockets and native
  code with clear `PermissionError("sandbox: ...")` errors. It is not a boundary: pure Python
  can switch it off (the hook's state sits in the process's memory), so without Landlock a
  program can read and write files outside the workspace;
- the seccomp allowlist and the resource limits, as in every mode.

The hook looks up no global or builtin name at call time (everything is bound in
`install_guard`), so a program that edits `builtins`, `os` or this module's globals does not
change it. Not covered by the hook: functions that raise no audit event (`os.chroot`,
`os.mknod`), `os.open(name, dir_fd=fd)` with `..` in `name`, and the race between a check and
its system call.
"""

import ctypes
import os
import posix
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000

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


def _no_fork_exec(*args, **kwargs):
    raise PermissionError("sandbox: starting processes is not allowed")


def install_guard(root: str, reads: tuple[str, ...]) -> None:
    """Adds the legacy audit hook (module docstring)."""
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
