"""API key digests for `api_keys[].sha256`: `python -m cluster.keys hash KEY` or `... new`."""

from __future__ import annotations

import argparse
import secrets
import sys

from core.config import hash_key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.keys")
    commands = parser.add_subparsers(dest="command", required=True)
    hash_cmd = commands.add_parser("hash", help="print the SHA-256 digest of a key")
    hash_cmd.add_argument("key")
    commands.add_parser("new", help="print a fresh random key, then its digest")
    args = parser.parse_args(argv)
    if args.command == "new":
        args.key = f"gps-{secrets.token_urlsafe(24)}"
        print(args.key)
    print(hash_key(args.key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
