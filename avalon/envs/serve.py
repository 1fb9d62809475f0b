"""Serve Avalon environments over the Open Reward Standard (`avalon/envs/ors_server.py`).

    python -m avalon.envs.serve --env=avalon.envs.parallel:ParallelSubtasks --port=8080
    python -m avalon.envs.serve --env=configs/my_envs.py:make --env=pkg.mod:other --budget=2

`--env=MODULE:FACTORY` (repeatable): FACTORY is called with no arguments and returns an
Environment or a list of them; MODULE is a dotted module or a path to a .py file. The server
listens on 127.0.0.1 unless `--host` says otherwise (a warning is printed: the environments
then answer anyone who can reach the port). `--budget` is the hire budget each session's
`on_start` gets (a task spec's `budget` overrides it; an Avalon client, which speaks the
extension of docs/ors_extension.md, sends each rollout's own). Stops on Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from avalon.envs.base import Environment
from avalon.envs.ors_server import ORS_LIMITS, OrsServer
from avalon.envs.transport import ServerLimits


def load_factory(spec: str) -> list[Environment]:
    """The environments `MODULE:FACTORY` makes (a ValueError names the spec)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--env must be MODULE:FACTORY, got {spec!r}")
    if module_name.endswith(".py"):
        loader = importlib.util.spec_from_file_location("avalon_served_envs", module_name)
        if loader is None or loader.loader is None:
            raise ValueError(f"--env {spec!r}: cannot load {module_name!r}")
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    if attr not in vars(module):
        raise ValueError(f"--env {spec!r}: module {module_name!r} has no {attr!r}")
    made = vars(module)[attr]()
    envs = list(made) if isinstance(made, (list, tuple)) else [made]
    for env in envs:
        for need in ("name", "task_ids", "task", "session", "vocabulary"):
            if not hasattr(env, need):
                raise ValueError(f"--env {spec!r} made {type(env).__name__}, which is not an "
                                 f"Environment (no {need!r})")
    return envs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m avalon.envs.serve",
                                     description="Serve Avalon environments over ORS.")
    parser.add_argument("--env", action="append", required=True, metavar="MODULE:FACTORY")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--budget", type=int, default=0)
    parser.add_argument("--session_ttl_s", type=float, default=ORS_LIMITS.session_ttl_s)
    args = parser.parse_args(argv)
    envs = [env for spec in args.env for env in load_factory(spec)]
    limits = ServerLimits(session_ttl_s=args.session_ttl_s)
    server = OrsServer(envs, host=args.host, port=args.port, limits=limits, budget=args.budget)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {args.host}: anyone who can reach port {args.port} can "
              f"open sessions", file=sys.stderr)
    names = ", ".join(env.name for env in envs)
    print(f"serving {names} over ORS at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
