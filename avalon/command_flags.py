"""One-line errors for the commands that take an ml_collections `--config` (absl flags):
`python -m avalon.main`, `python -m avalon.tools.evaluate`. A bad config path, an override of
a key the config does not have, or a value absl cannot parse ends the program with one line
naming the flag, never a traceback out of ml_collections.

    app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, "avalon.tools.evaluate"))
"""

from __future__ import annotations

import importlib.util
import os
import sys

from absl import flags


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


def parse_flags(argv, prog: str):
    """absl flag parsing; every bad flag value ends the program with one line naming it (and
    `prog`, the command's module)."""
    path = _config_file(argv)
    if path is not None and not os.path.isfile(path.partition(":")[0]):
        sys.exit(f"{prog}: --config={path}: no such config file")
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        bad = _unknown_override(argv)
        if bad is None:
            raise
        hint = _last_line(str(e)) if "Did you mean" in str(e) else ""
        sys.exit(f"{prog}: {bad}: no such key in the config (an override can only change a "
                 f"key the config file sets){'; ' + hint if hint else ''}")
    except flags.Error as e:  # a value absl could not parse, a config file that raised
        first = str(e).splitlines()[0] if str(e) else repr(e)
        head = first.split(": ", 1)[0].removeprefix("flag ")
        cause = _last_line(str(e))
        if cause == first:  # no traceback inside: absl's own one-line message
            cause = first.split(": ", 1)[-1]
        sys.exit(f"{prog}: {head}: {cause.removeprefix('ValueError: ')}")
