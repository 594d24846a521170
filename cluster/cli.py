"""`gps`: one command line for the project's tools (`[project.scripts]` in pyproject.toml).

    gps run [CONFIG]              serve the app (`serve run cluster.app:build [config=CONFIG]`)
    gps reload CONFIG [--app N]   apply a new config to the running app in place
    gps check [CONFIG]            refuse what cannot start, warn what will degrade
    gps capacity MODEL [...]      measure what a model's engine really holds
    gps keys hash | new           API key digests for `api_keys[].sha256` (the key on stdin)
    gps batch ...                 the Batch API from a shell
    gps models prepare [...]      the demo model, ready for vLLM and llama.cpp
    gps --version

Each subcommand is the module's own CLI (`python -m cluster.reload`, `cluster.config`,
`cluster.capacity`, `cluster.keys`, `cluster.batch`, `cluster.models`), which keep working as
they are.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

__all__ = ["main"]

USAGE = __doc__.split("\n\n")[1]


def _run(args: Sequence[str]) -> int:
    """Replace this process with Serve's own `serve run` (its signals and exit are Serve's)."""
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: gps run [CONFIG]", file=sys.stderr)
        return 2
    serve = Path(sys.executable).with_name("serve")
    command = [str(serve), "run", "cluster.app:build", *(f"config={a}" for a in args)]
    os.execv(command[0], command)
    return 0  # not reached


def _module_main(module: str, *prefix: str) -> Callable[[Sequence[str]], int]:
    def run(args: Sequence[str]) -> int:
        main: Callable[[list[str]], int] = importlib.import_module(module).main
        return main([*prefix, *args])

    return run


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "run": _run,
    "reload": _module_main("cluster.reload"),
    "check": _module_main("cluster.config", "check"),
    "capacity": _module_main("cluster.capacity"),
    "keys": _module_main("cluster.keys"),
    "batch": _module_main("cluster.batch"),
    "models": _module_main("cluster.models"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(USAGE)
        return 0 if args else 2
    if args[0] == "--version":
        print(f"gps {metadata.version('gpu-pool-serve')}")
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"gps: unknown command {args[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    return command(args[1:])


if __name__ == "__main__":
    sys.exit(main())
