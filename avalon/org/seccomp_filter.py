"""The sandbox's system-call filter: an allowlist, as a classic BPF program for seccomp.

Built here (the trainer) and installed by the sandboxed process itself before the agent's code
runs (`sandbox_boot.py`, `install_filter`), so the kernel refuses everything else whatever the
code does, native code and interpreter tricks included. Default: the call fails with EPERM.
Allowed: what a Python program needs to compute, read and write files, use threads, pipes, timers
and local (AF_UNIX) sockets; in detail `ALLOWED`, and with their arguments checked:
- `clone` only with `CLONE_THREAD` (threads, never a new process); `clone3` fails with ENOSYS
  (so the C library falls back to `clone`, which the filter can inspect);
- `ioctl` only the terminal and descriptor queries Python's I/O makes (`IOCTLS`);
- `fcntl` anything but `F_SETPIPE_SZ` (a pipe stays at its 64 KiB default: pipes hold at most
  `RLIMIT_NOFILE / 2 * 64 KiB`), leases and directory notifications (`F_NOTIFY`: another
  sandbox reading a shared directory would signal this one), and record locks, below;
- locks: `flock` and the record locks' `F_SETLK`, `F_SETLKW`, `F_OFD_SETLK`, `F_OFD_SETLKW`
  succeed without doing anything. Every sandbox binds the same read-only files and device
  nodes (the interpreter, /dev/null), so a real lock on one is a channel between programs of
  different organisations running at once. A run is one process alone in its sandbox, so no
  lock of its own could ever wait for another process: taking one as a no-op keeps the
  programs that lock working (sqlite, WAL mode too). The queries (`F_GETLK`, `F_OFD_GETLK`)
  run, and find no lock a sandbox took, since none can take one. Locks between two descriptors
  of the same run (`flock`, OFD locks) do not exclude each other;
- `prctl` only to name a thread, read its name, dumpability or bounding set, and name a
  mapping (`capget` too: a program may see that it holds no capability);
- `socket` and `socketpair` only `AF_UNIX` (the network namespace has nothing else anyway).
Refused, among others: every way to start a process (`execve`, `fork`, `vfork`), `memfd_create`,
System V IPC, `ptrace` and `process_vm_*`, `io_uring_*`, `userfaultfd`, `bpf`,
`perf_event_open`, `syslog`, `unshare`/`setns`/`mount`, `keyctl`, `setpriority`,
`sched_setaffinity`/`sched_setscheduler`, `clock_settime`/`settimeofday`/`adjtimex`,
`sethostname`, `personality`, `mlock`. A call of another architecture (x32, a 32-bit ABI) kills
the process. Architectures: x86-64 and arm64 (`TABLES`, from libseccomp's tables); any other is
refused (`UnsupportedArchitecture`): a run never goes unfiltered.
"""

from __future__ import annotations

import struct

# include/uapi/linux/seccomp.h, filter.h, audit.h
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO = 0x80000000, 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
EPERM, ENOSYS = 1, 38
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
DATA_NR, DATA_ARCH = 0, 4
X32_SYSCALL_BIT = 0x40000000
CLONE_THREAD = 0x00010000
F_SETPIPE_SZ = 1031
F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW = 6, 7, 37, 38
F_SETLEASE, F_GETLEASE, F_NOTIFY = 1024, 1025, 1026
NOTHING_DONE = SECCOMP_RET_ERRNO | 0  # the call returns 0 and the kernel does nothing
# fcntl commands that do not simply run (module docstring): the command -> what the call gets.
FCNTL = {F_SETPIPE_SZ: SECCOMP_RET_ERRNO | EPERM, F_SETLEASE: SECCOMP_RET_ERRNO | EPERM,
         F_GETLEASE: SECCOMP_RET_ERRNO | EPERM, F_NOTIFY: SECCOMP_RET_ERRNO | EPERM,
         F_SETLK: NOTHING_DONE, F_SETLKW: NOTHING_DONE, F_OFD_SETLK: NOTHING_DONE,
         F_OFD_SETLKW: NOTHING_DONE}
AF_UNIX = 1
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
IOCTLS = (0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)  # TCGETS TIOCGWINSZ FIONREAD FIONBIO
#                                                             FIONCLEX FIOCLEX
PRCTLS = (3, 15, 16, 23, 0x53564D41)  # PR_GET_DUMPABLE, PR_SET/GET_NAME, PR_CAPBSET_READ,
#                                          PR_SET_VMA

TABLES = {
    "x86_64": """
read=0 write=1 readv=19 writev=20 pread64=17 pwrite64=18 preadv=295 pwritev=296 preadv2=327
pwritev2=328 lseek=8 close=3 close_range=436 open=2 openat=257 creat=85 stat=4 fstat=5 lstat=6
newfstatat=262 statx=332 statfs=137 fstatfs=138 access=21 faccessat=269 faccessat2=439
readlink=89 readlinkat=267 getcwd=79 chdir=80 fchdir=81 mkdir=83 mkdirat=258 rmdir=84
unlink=87 unlinkat=263 rename=82 renameat=264 renameat2=316 link=86 linkat=265 symlink=88
symlinkat=266 chmod=90 fchmod=91 fchmodat=268 truncate=76 ftruncate=77 fallocate=285 utime=132
utimes=235 utimensat=280 futimesat=261 getdents=78 getdents64=217 mmap=9 munmap=11 mprotect=10
mremap=25 madvise=28 brk=12 msync=26 mincore=27 rt_sigaction=13 rt_sigprocmask=14
rt_sigreturn=15 rt_sigpending=127 rt_sigtimedwait=128 rt_sigsuspend=130 sigaltstack=131
kill=62 tgkill=234 tkill=200 getpid=39 gettid=186 getppid=110 getuid=102 geteuid=107
getgid=104 getegid=108 getgroups=115 getresuid=118 getresgid=120 getpgrp=111 getpgid=121
getsid=124 uname=63 sysinfo=99 times=100 getrusage=98 getrlimit=97 prlimit64=302 setrlimit=160
clock_gettime=228 clock_getres=229 clock_nanosleep=230 nanosleep=35 gettimeofday=96 time=201
futex=202 set_robust_list=273 get_robust_list=274 set_tid_address=218 rseq=334 sched_yield=24
sched_getaffinity=204 sched_getparam=143 sched_getscheduler=145 sched_get_priority_max=146
sched_get_priority_min=147 getcpu=309 exit=60 exit_group=231 wait4=61 waitid=247 pipe=22
pipe2=293 dup=32 dup2=33 dup3=292 fcntl=72 ioctl=16 poll=7 ppoll=271 select=23 pselect6=270
epoll_create=213 epoll_create1=291 epoll_ctl=233 epoll_wait=232 epoll_pwait=281
epoll_pwait2=441 eventfd=284 eventfd2=290 timerfd_create=283 timerfd_settime=286
timerfd_gettime=287 signalfd=282 signalfd4=289 socketpair=53 socket=41 connect=42 bind=49
listen=50 accept=43 accept4=288 sendto=44 recvfrom=45 sendmsg=46 recvmsg=47 sendmmsg=307
recvmmsg=299 shutdown=48 getsockname=51 getpeername=52 setsockopt=54 getsockopt=55
getrandom=318 arch_prctl=158 prctl=157 umask=95 flock=73 fsync=74 fdatasync=75
sync_file_range=277 sendfile=40 copy_file_range=326 clone=56 clone3=435 alarm=37 pause=34
getitimer=36 setitimer=38 fadvise64=221 readahead=187 capget=125
""",
    "aarch64": """
read=63 write=64 readv=65 writev=66 pread64=67 pwrite64=68 preadv=69 pwritev=70 preadv2=286
pwritev2=287 lseek=62 close=57 close_range=436 openat=56 fstat=80 newfstatat=79 statx=291
statfs=43 fstatfs=44 faccessat=48 faccessat2=439 readlinkat=78 getcwd=17 chdir=49 fchdir=50
mkdirat=34 unlinkat=35 renameat=38 renameat2=276 linkat=37 symlinkat=36 fchmod=52 fchmodat=53
truncate=45 ftruncate=46 fallocate=47 utimensat=88 getdents64=61 mmap=222 munmap=215
mprotect=226 mremap=216 madvise=233 brk=214 msync=227 mincore=232 rt_sigaction=134
rt_sigprocmask=135 rt_sigreturn=139 rt_sigpending=136 rt_sigtimedwait=137 rt_sigsuspend=133
sigaltstack=132 kill=129 tgkill=131 tkill=130 getpid=172 gettid=178 getppid=173 getuid=174
geteuid=175 getgid=176 getegid=177 getgroups=158 getresuid=148 getresgid=150 getpgid=155
getsid=156 uname=160 sysinfo=179 times=153 getrusage=165 getrlimit=163 prlimit64=261
setrlimit=164 clock_gettime=113 clock_getres=114 clock_nanosleep=115 nanosleep=101
gettimeofday=169 futex=98 set_robust_list=99 get_robust_list=100 set_tid_address=96 rseq=293
sched_yield=124 sched_getaffinity=123 sched_getparam=121 sched_getscheduler=120
sched_get_priority_max=125 sched_get_priority_min=126 getcpu=168 exit=93 exit_group=94
wait4=260 waitid=95 pipe2=59 dup=23 dup3=24 fcntl=25 ioctl=29 ppoll=73 pselect6=72
epoll_create1=20 epoll_ctl=21 epoll_pwait=22 epoll_pwait2=441 eventfd2=19 timerfd_create=85
timerfd_settime=86 timerfd_gettime=87 signalfd4=74 socketpair=199 socket=198 connect=203
bind=200 listen=201 accept=202 accept4=242 sendto=206 recvfrom=207 sendmsg=211 recvmsg=212
sendmmsg=269 recvmmsg=243 shutdown=210 getsockname=204 getpeername=205 setsockopt=208
getsockopt=209 getrandom=278 prctl=167 umask=166 flock=32 fsync=82 fdatasync=83
sync_file_range=84 sendfile=71 copy_file_range=285 clone=220 clone3=435 getitimer=102
setitimer=103 fadvise64=223 readahead=213 capget=90
""",
}
CHECKED = ("clone", "clone3", "ioctl", "fcntl", "prctl", "socket", "socketpair", "flock")
ALLOWED = tuple(n for n in TABLES["x86_64"].split() if n.split("=")[0] not in CHECKED)


class UnsupportedArchitecture(OSError):
    """No system-call table for this machine: the sandbox refuses to run code unfiltered."""


def _numbers(machine: str) -> dict[str, int]:
    if machine not in TABLES:
        raise UnsupportedArchitecture(f"sandbox: no system-call filter for architecture "
                                      f"{machine!r} (have {sorted(TABLES)})")
    return {n: int(v) for n, v in (item.split("=") for item in TABLES[machine].split())}


def _arg(i: int) -> int:
    """Offset of the low 32 bits of argument i in `struct seccomp_data` (little-endian)."""
    return 16 + 8 * i


def _ret(value: int) -> tuple[int, int, int, int]:
    return (BPF_RET_K, 0, 0, value)


def _one_of(arg: int, values, allow_them: bool) -> list[tuple[int, int, int, int]]:
    """Loads argument `arg`; returns ALLOW when it is (or, not `allow_them`, is not) one of
    `values`, else EPERM."""
    hit, miss = (SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM) if allow_them else (
        SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW)
    rows = [(BPF_LD_W_ABS, 0, 0, _arg(arg))]
    for v in values:
        rows += [(BPF_JEQ_K, 0, 1, v), _ret(hit)]
    return rows + [_ret(miss)]


def _by_value(arg: int, returns: dict[int, int], default: int) -> list[tuple[int, int, int, int]]:
    """Loads argument `arg`; returns `returns[value]` for the values listed, else `default`."""
    rows = [(BPF_LD_W_ABS, 0, 0, _arg(arg))]
    for value, ret in returns.items():
        rows += [(BPF_JEQ_K, 0, 1, value), _ret(ret)]
    return rows + [_ret(default)]


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) rows. Every check either returns or falls through to
    the next, so no jump is longer than one block (BPF's jumps are 8-bit)."""
    nr = _numbers(machine)
    deny = SECCOMP_RET_ERRNO | EPERM
    rows = [(BPF_LD_W_ABS, 0, 0, DATA_ARCH), (BPF_JEQ_K, 1, 0, AUDIT_ARCH[machine]),
            _ret(SECCOMP_RET_KILL_PROCESS), (BPF_LD_W_ABS, 0, 0, DATA_NR),
            (BPF_JGE_K, 0, 1, X32_SYSCALL_BIT), _ret(SECCOMP_RET_KILL_PROCESS)]
    blocks = {
        "clone": [(BPF_LD_W_ABS, 0, 0, _arg(0)), (BPF_JSET_K, 0, 1, CLONE_THREAD),
                  _ret(SECCOMP_RET_ALLOW), _ret(deny)],
        "clone3": [_ret(SECCOMP_RET_ERRNO | ENOSYS)],
        "ioctl": _one_of(1, IOCTLS, True),
        "fcntl": _by_value(1, FCNTL, SECCOMP_RET_ALLOW),
        "flock": [_ret(NOTHING_DONE)],
        "prctl": _one_of(0, PRCTLS, True),
        "socket": _one_of(0, (AF_UNIX,), True),
        "socketpair": _one_of(0, (AF_UNIX,), True),
    }
    for name, block in blocks.items():
        rows += [(BPF_JEQ_K, 0, len(block), nr[name]), *block]
    for item in ALLOWED:
        name = item.split("=")[0]
        if name in nr:
            rows += [(BPF_JEQ_K, 0, 1, nr[name]), _ret(SECCOMP_RET_ALLOW)]
    return rows + [_ret(deny)]


def program_bytes(machine: str) -> bytes:
    """`program(machine)` as the kernel's `struct sock_filter` array."""
    return b"".join(struct.pack("<HBBI", *row) for row in program(machine))
