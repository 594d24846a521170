"""Submit a batch to the gateway and watch it: `python -m cluster.batch submit FILE --wait`.

    python -m cluster.batch submit requests.jsonl --endpoint /v1/chat/completions --wait
    python -m cluster.batch watch batch-...      # a running batch: watch it again, any time
    python -m cluster.batch cancel batch-...

`--url` is the gateway (default http://127.0.0.1:8000); the key comes from `--key` or the
environment (GPS_API_KEY, else OPENAI_API_KEY). Watching shows a progress bar of the lines
done; at the end the output and error files are saved beside `--save` (default: the current
directory) as `<batch id>.output.jsonl` and `<batch id>.errors.jsonl`. Stopping the watch
(Ctrl-C) never stops the batch: it runs in the gateway.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

ENDED = {"completed", "failed", "expired", "cancelled"}
POLL_S = 2.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.batch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", default=os.environ.get("GPS_API_KEY")
                        or os.environ.get("OPENAI_API_KEY"))  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    submit = commands.add_parser("submit", help="upload a JSONL file and start its batch")
    submit.add_argument("file", type=Path)
    submit.add_argument("--endpoint", default="/v1/chat/completions")
    submit.add_argument("--window", default="24h", help="completion_window")
    submit.add_argument("--wait", action="store_true", help="watch it to its end")
    for name, text in (("watch", "watch a batch to its end"), ("cancel", "cancel a batch")):
        command = commands.add_parser(name, help=text)
        command.add_argument("batch_id")
    for command in (submit, commands.choices["watch"]):
        command.add_argument("--save", type=Path, default=Path("."),
                             help="where the output and error files go")  # fmt: skip
    args = parser.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=120) as gateway:
        try:
            return _run(gateway, args)
        except GatewayError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1


class GatewayError(Exception):
    pass


def _run(gateway: httpx.Client, args: argparse.Namespace) -> int:
    if args.command == "cancel":
        batch = _json(gateway.post(f"/v1/batches/{args.batch_id}/cancel"))
        print(f"{batch['id']}: {batch['status']}")
        return 0
    if args.command == "submit":
        with args.file.open("rb") as data:
            uploaded = _json(gateway.post("/v1/files", data={"purpose": "batch"},
                                          files={"file": (args.file.name, data)}))  # fmt: skip
        batch = _json(gateway.post("/v1/batches", json={
            "input_file_id": uploaded["id"], "endpoint": args.endpoint,
            "completion_window": args.window}))  # fmt: skip
        print(f"{batch['id']}: {batch['status']} ({batch['request_counts']['total']} lines)")
        if not args.wait:
            print(f"watch it with: python -m cluster.batch watch {batch['id']}")
            return 0
        args.batch_id = batch["id"]
    batch = watch(gateway, args.batch_id)
    save(gateway, batch, args.save)
    return 0 if batch["status"] == "completed" else 2


def watch(gateway: httpx.Client, batch_id: str) -> dict[str, Any]:
    """Poll the batch to its end with a progress bar of its lines done (ok or failed)."""
    batch = _json(gateway.get(f"/v1/batches/{batch_id}"))
    with tqdm(total=batch["request_counts"]["total"], unit="line", desc=batch_id[:18]) as bar:
        while True:
            counts = batch["request_counts"]
            bar.n = counts["completed"] + counts["failed"]
            bar.set_postfix(status=batch["status"], failed=counts["failed"])
            bar.refresh()
            if batch["status"] in ENDED:
                return batch
            time.sleep(POLL_S)
            batch = _json(gateway.get(f"/v1/batches/{batch_id}"))


def save(gateway: httpx.Client, batch: dict[str, Any], directory: Path) -> None:
    counts = batch["request_counts"]
    print(f"{batch['id']}: {batch['status']}, {counts['completed']} done, "
          f"{counts['failed']} failed of {counts['total']}")  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    for key, suffix in (("output_file_id", "output"), ("error_file_id", "errors")):
        if not batch.get(key):
            continue
        path = directory / f"{batch['id']}.{suffix}.jsonl"
        with gateway.stream("GET", f"/v1/files/{batch[key]}/content") as reply, \
                path.open("wb") as out:  # fmt: skip
            if reply.status_code != 200:
                raise GatewayError(f"{reply.status_code} reading {batch[key]}")
            for part in reply.iter_bytes():
                out.write(part)
        print(f"saved {path}")


def _json(reply: httpx.Response) -> dict[str, Any]:
    if reply.status_code != 200:
        try:
            message = reply.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = reply.text[:500]
        raise GatewayError(f"{reply.status_code}: {message}")
    return dict(reply.json())


if __name__ == "__main__":
    sys.exit(main())
