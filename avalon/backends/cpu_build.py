"""Building the C++ kernels beside this file (XLA FFI handlers) and registering them with JAX.

Each kernel is compiled once per machine, at first use, with the system's C++ compiler and
jaxlib's FFI headers (`-O3 -march=native`), into a cache directory keyed by its source, the
headers it includes from here, jaxlib's and jax's versions and the CPU; `register` builds (if
needed), loads and registers one. Callers turn a failure into one warning and keep XLA's path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jaxlib

HERE = Path(__file__).parent
# Included by the sources here: part of every build's key.
HEADERS = (HERE / "cpu_ffi.h", HERE / "cpu_parallel.h", HERE / "cpu_vector.h")
# Where built kernels are kept (one file per source / jaxlib / CPU); the env var moves it.
CACHE_ENV = "AVALON_KERNEL_CACHE"
BUILD_TIMEOUT_S = 300
FAILURES = (OSError, RuntimeError, subprocess.SubprocessError, AttributeError)


def _cpu_identity() -> str:
    """What the `-march=native` build depends on: the CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "avalon" / "kernels"


def library_path(source: Path) -> Path:
    """Where this machine's build of `source` lives (built or not)."""
    digest = hashlib.sha256(source.read_bytes())
    for header in HEADERS:
        digest.update(header.read_bytes())
    digest.update(jaxlib.__version__.encode() + jax.__version__.encode()
                  + _cpu_identity().encode())
    return _cache_dir() / f"{source.stem}-{digest.hexdigest()[:16]}.so"


def _compile(source: Path, out: Path) -> None:
    """Compile `source` into `out` (atomically); raises RuntimeError with the compiler's
    message."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") \
        or shutil.which("clang++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++, g++ or clang++) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    base = [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-I", jax.ffi.include_dir(),
            "-I", str(HERE), str(source)]
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        err = ""
        # -march=native where the compiler takes it (GCC, clang on x86); plain -O3 otherwise.
        for extra in (["-march=native"], []):
            run = subprocess.run(base + extra + ["-o", tmp], capture_output=True, text=True,
                                 timeout=BUILD_TIMEOUT_S)
            if run.returncode == 0:
                os.replace(tmp, out)
                return
            err = run.stderr.strip().splitlines()[-1:] or ["(no message)"]
        raise RuntimeError(f"{cxx} failed: {err[0]}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def register(source: Path, symbols: dict[str, str]) -> ctypes.CDLL:
    """Build `source` (once per machine), load it and register each FFI target in `symbols`
    (target name -> the handler's exported symbol) for the CPU; returns the loaded library.
    Raises one of `FAILURES`."""
    path = library_path(source)
    if not path.exists():
        _compile(source, path)
    lib = ctypes.cdll.LoadLibrary(str(path))
    for target, symbol in symbols.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                    platform="cpu")
    return lib


def ready(source: Path, symbols: dict[str, str], what: str, instead: str) -> bool:
    """`register(source, symbols)`; on a failure one warning naming the kernel (`what`) and
    what is used `instead`, and False."""
    try:
        register(source, symbols)
        return True
    except FAILURES as e:
        warnings.warn(f"avalon: the CPU {what} kernel ({source.name}) is not available ({e}); "
                      f"{instead}", stacklevel=3)
        return False
