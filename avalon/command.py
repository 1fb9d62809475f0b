"""How a command-line entry point ends: one line for bad input and for Ctrl-C, never a traceback.

Every `python -m` program of Avalon (`avalon.main`, `avalon.analyze`, `avalon.tools.*`,
`experiments.sweeps.run`, `experiments.safety.run`) runs its body through `run`:

    if __name__ == "__main__":
        command.run("avalon.tools.view", main, interrupted="stopped; nothing was written")

- `Stop(message)`, a `ValueError` (the config checks name the field and the value) or an
  `OSError` with a file name (a missing events file, a read-only workdir, a file where a
  directory belongs) ends the program with `PROG: message` on stderr, exit code 2;
- Ctrl-C ends it with `PROG: ` and the command's `interrupted` text (a string, or a function
  called then: `avalon.main` says which step it stopped at), exit code 130;
- anything else is a bug and keeps its traceback.

Library logging (absl and Python logging from JAX, orbax and transformers, XLA's C++ log,
Python warnings) is off unless `--verbose` is on the command line; with `--verbose` a one-line
error also prints the traceback behind it. `ArgumentParser` is argparse with one-line errors,
`absl_flags_parser` does the same for absl flags.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd program
VERBOSE_FLAG = "--verbose"


class Stop(Exception):
    """Input the command refuses; the message names the thing and what to do about it."""


def verbose(argv: list[str] | None = None) -> bool:
    """Whether `--verbose` is on the command line."""
    return VERBOSE_FLAG in (sys.argv[1:] if argv is None else argv)


def quiet_libraries() -> None:
    """Library logging off: set before the libraries start where it is read at start-up (XLA's
    C++ log level, transformers' verbosity), and on the loggers of those already imported."""
    # XLA's C++ log (absl, read when jaxlib loads): FATAL only, so no "Very slow compile?"
    # banners (slow_operation_alarm, E level) on the console. A failure that matters reaches
    # Python as an exception either way; `--verbose` or the user's own setting keeps the log.
    # A level set by the user (or an earlier call) stays; importing jax sets "1" when none is
    # set, so with jax imported that value is taken as jax's default, not the user's.
    level, jax_loaded = os.environ.get("TF_CPP_MIN_LOG_LEVEL"), "jax" in sys.modules
    chosen = level is not None and not (jax_loaded and level == "1")
    if not chosen:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.simplefilter("ignore")
    logging.getLogger().setLevel(logging.ERROR)  # the "jax" logger inherits it
    # Not the "jax" logger by name before jax is imported: jax takes that logger's level as
    # the default of `jax_logging_level` and sets XLA's C++ log level from it (ERROR -> the
    # E-level banners are back), over TF_CPP_MIN_LOG_LEVEL.
    names = ("orbax", "absl", "transformers", "huggingface_hub", "etils", "gcsfs", "fsspec",
             "urllib3", "matplotlib", "PIL") + (("jax",) if jax_loaded else ())
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    if not chosen and jax_loaded:  # jaxlib read the level at import: set it through jax
        import jax
        jax.config.update("jax_logging_level", "CRITICAL")  # C++ log: FATAL only
    if "absl.logging" in sys.modules:
        from absl import logging as absl_logging
        absl_logging.set_verbosity(absl_logging.ERROR)
    if "transformers" in sys.modules:
        import transformers
        transformers.logging.set_verbosity_error()


def describe(error: BaseException) -> str:
    """One line for a refused input: the file and what the system said, or the message."""
    if isinstance(error, OSError) and error.filename is not None:
        what = error.strerror or type(error).__name__
        hint = {FileNotFoundError: "no such file or directory",
                IsADirectoryError: "is a directory, not a file",
                NotADirectoryError: "a path component is a file, not a directory",
                PermissionError: "permission denied (choose a path you can write, or fix its "
                                 "permissions)",
                FileExistsError: "exists already and is in the way"}.get(type(error), what)
        return f"{error.filename}: {hint}"
    text = str(error).strip() or type(error).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0] if len(lines) == 1 else "; ".join(line.strip() for line in lines)


def run(prog: str, body: Callable[[], object], *,
        interrupted: str | Callable[[], str] = "stopped; rerun the same command to start again",
        argv: list[str] | None = None):
    """Run `body()` as the program `prog` (see the module docstring); returns what it returns."""
    loud = verbose(argv)
    if not loud:
        quiet_libraries()
    try:
        return body()
    except KeyboardInterrupt:
        text = interrupted() if callable(interrupted) else interrupted
        _end(f"{prog}: {text}", EXIT_INTERRUPTED)
    except (Stop, ValueError, OSError) as e:
        if isinstance(e, OSError) and e.filename is None and not isinstance(e, Stop):
            raise  # a socket or device error without a path: not an input the user gave
        if loud:
            traceback.print_exc()
        _end(f"{prog}: {describe(e)}", EXIT_BAD_INPUT)


def _end(line: str, code: int):
    sys.stdout.flush()
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    raise SystemExit(code)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line (`PROG: --flag: what is wrong (see --help)`) instead
    of a usage block, and that takes `--verbose` (library logging and tracebacks)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument(VERBOSE_FLAG, action="store_true",
                          help="show library logging and the traceback behind an error")

    def error(self, message):
        raise Stop(f"{message} (see --help)")


def absl_flags_parser(*, config: bool = False):
    """A `flags_parser` for absl's `app.run` that ends every bad flag with one line naming it;
    `config=True` for programs with an ml_collections `--config` (their overrides checked too,
    `avalon/command_flags.py`). Defines `--verbose` once."""
    from absl import flags

    if VERBOSE_FLAG[2:] not in flags.FLAGS:
        flags.DEFINE_bool(VERBOSE_FLAG[2:], False,
                          "show library logging and the traceback behind an error")

    def parse(argv):
        from avalon import command_flags
        try:
            args = (command_flags.parse_config_flags if config
                    else command_flags.parse_plain_flags)(argv)
        except command_flags.FlagError as e:
            raise Stop(str(e)) from None
        if len(args) > 1:
            raise Stop(f"unexpected arguments {args[1:]} (flags are --name=value; see --help)")
        if not flags.FLAGS[VERBOSE_FLAG[2:]].value:
            quiet_libraries()  # absl's handler and verbosity are set up by now
        return args

    return parse


class ProgressLine:
    """`bar(done, total)` redraws one stderr line: `LABEL [#####.....] 12/48 UNIT 35s ETA 1m10s`
    (at most 10 redraws a second; a new line when done reaches total)."""

    def __init__(self, label: str, unit: str, *, stream=None, width: int = 30, clock=None):
        import time
        self.label, self.unit, self.width = label, unit, width
        self.stream = stream or sys.stderr
        self.clock = clock or time.monotonic
        self.start, self.last = self.clock(), -1.0

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        elapsed = now - self.start
        eta = elapsed / done * (total - done) if done else 0.0
        filled = int(self.width * done / max(total, 1))
        self.stream.write(f"\r{self.label} [{'#' * filled:<{self.width}}] {done}/{total} "
                          f"{self.unit} {_clock(elapsed)} ETA {_clock(eta) if done else '?'}")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
