"""API key digests for `api_keys[].sha256`: `python -m cluster.keys hash` or `... new`.

`hash` reads the key from standard input (`... hash < key.txt`, or piped from a secret store)
or, at a terminal, from a prompt that does not echo it: never from the command line, where shell
history and `ps` would keep it.
"""

from __future__ import annotations

import argparse
import getpass
import secrets
import sys
from typing import TextIO

from core.config import hash_key


def read_key(stdin: TextIO, prompt: str = "API key (not echoed): ") -> str:
    """The key from `stdin` (its first line) or, at a terminal, from a prompt."""
    if stdin.isatty():
        return getpass.getpass(prompt)
    return stdin.readline().rstrip("\r\n")


def main(argv: list[str] | None = None, stdin: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.keys")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "hash", help="print the SHA-256 digest of a key read from stdin or a prompt"
    )
    commands.add_parser("new", help="print a fresh random key, then its digest")
    args = parser.parse_args(argv)
    if args.command == "new":
        key = f"gps-{secrets.token_urlsafe(24)}"
        print(key)
    else:
        key = read_key(stdin or sys.stdin)
        if not key:
            print("gpu-pool-serve: no key given (stdin or the prompt was empty)", file=sys.stderr)
            return 2
    print(hash_key(key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
