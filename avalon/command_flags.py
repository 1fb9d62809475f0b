"""absl flag parsing with one-line errors (`avalon.command.absl_flags_parser` uses it).

For the commands that take an ml_collections `--config` (`python -m avalon.main`,
`avalon.tools.evaluate`, `avalon.tools.env_baselines`), a bad config path, an override of a key
the config does not have, or a value absl cannot parse is a `FlagError` naming the flag (which
`avalon.command` ends the program with, one line), never a traceback out of ml_collections; for
every absl command, a flag absl refuses (an unknown flag, a value outside an enum, a required
flag left out) is a `FlagError` naming it too. This module imports nothing of Avalon's.
"""

from __future__ import annotations

import importlib.util
import os
import re

from absl import flags


class FlagError(Exception):
    """A flag the command refuses; the message names it (`avalon.command` makes it a `Stop`)."""


def _config_file(argv) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _unknown_override(argv) -> str | None:
    """The first `--config.a.b=v` whose path the config file does not have."""
    path = _config_file(argv)
    if path is None:
        return None
    file, _, arg = path.partition(":")
    spec = importlib.util.spec_from_file_location("avalon_config_check", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    for a in argv:
        if not a.startswith("--config."):
            continue
        node = config
        for key in a[len("--config."):].split("=", 1)[0].split("."):
            if not hasattr(node, "keys") or key not in node.keys():
                return a.split("=", 1)[0]
            node = node[key]
    return None


def _last_line(message: str) -> str:
    """The cause of an error whose message embeds a traceback (config_flags wraps exceptions
    raised inside `get_config` that way): its last non-empty line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else message


def parse_config_flags(argv):
    """absl flag parsing for a command with an ml_collections `--config`: every bad flag value
    is a `FlagError` naming it."""
    path = _config_file(argv)
    if path is not None and not os.path.isfile(path.partition(":")[0]):
        raise FlagError(f"--config={path}: no such config file")
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        bad = _unknown_override(argv)
        if bad is None:
            raise
        mean = re.search(r'Did you mean "([^"]+)"', str(e))
        hint = f'did you mean "{mean.group(1)}"?' if mean else ""
        raise FlagError(f"{bad}: no such key in the config (an override can only change a key the "
                   f"config file sets){'; ' + hint if hint else ''}") from None
    except flags.Error as e:
        raise FlagError(_flag_error(e)) from None


def parse_plain_flags(argv):
    """absl flag parsing: a flag absl refuses is a `FlagError` naming it."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        raise FlagError(_flag_error(e)) from None


def _flag_error(e: flags.Error) -> str:
    """absl's message (a value it could not parse, a config file that raised: its cause, not the
    traceback inside) as `--flag=value: what is wrong`."""
    text = str(e)
    if isinstance(e, flags.UnrecognizedFlagError):
        name = getattr(e, "flagname", "") or text
        return f"--{name}: no such flag (see --help)"
    first = text.splitlines()[0] if text else repr(e)
    head = first.split(": ", 1)[0].removeprefix("flag ")
    cause = _last_line(text)
    if cause == first:  # no traceback inside: absl's own one-line message
        cause = first.split(": ", 1)[-1]
    cause = cause.removeprefix("ValueError: ")
    if cause.startswith(f"Flag {head.split('=')[0]} must have a value other than None"):
        return f"{head.split('=')[0]}: required (see --help)"
    return f"{head}: {cause}"
