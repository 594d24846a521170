"""A stand-in for the `terraform` CLI (no provider can be downloaded here): `init`, `apply
-json` and `output -json` with `-chdir`, answering in Terraform's documented machine-readable
UI (https://developer.hashicorp.com/terraform/internals/machine-readable-ui): one JSON message a
line, `version`, `change_summary`, `outputs` and `diagnostic`. `-var fail=WHY` makes apply fail
with an error diagnostic. Each call's argv is appended to $TF_FAKE_LOG as a JSON line; state
(the node count applied) is kept in the module folder, as Terraform's own state is."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def emit(kind: str, message: str, level: str = "info", **fields: Any) -> None:
    line = {"@level": level, "@message": message, "@module": "terraform.ui", "type": kind}
    print(json.dumps({**line, **fields}))


def variables(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-var"]
    return dict(pair.split("=", 1) for pair in pairs)


def outputs(count: int) -> dict[str, Any]:
    addresses = [f"10.1.0.{n + 1}" for n in range(count)]
    return {"node_addresses": {"sensitive": False, "type": ["list", "string"], "value": addresses}}


def apply(module: Path, argv: list[str]) -> int:
    values = variables(argv)
    emit("version", "Terraform 1.9.8", terraform="1.9.8", ui="1.2")
    if "fail" in values:
        diagnostic = {
            "severity": "error",
            "summary": "Error launching source instance",
            "detail": f"VcpuLimitExceeded: {values['fail']}",
        }
        emit("diagnostic", f"Error: {diagnostic['summary']}", "error", diagnostic=diagnostic)
        return 1
    count = int(values.get("node_count", "1"))
    state = module / "terraform.tfstate"
    before = int(state.read_text()) if state.exists() else 0
    added, removed = max(0, count - before), max(0, before - count)
    changes = {"add": added, "change": 0, "import": 0, "remove": removed}
    emit("change_summary", "Plan", changes={**changes, "operation": "plan"})
    state.write_text(str(count))
    message = f"Apply complete! Resources: {added} added, 0 changed, {removed} destroyed."
    emit("change_summary", message, changes={**changes, "operation": "apply"})
    emit("outputs", "Outputs: 1", outputs=outputs(count))
    return 0


def main() -> int:
    argv = sys.argv[1:]
    with Path(os.environ["TF_FAKE_LOG"]).open("a") as log:
        log.write(json.dumps(argv) + "\n")
    chdir = next(a for a in argv if a.startswith("-chdir="))
    module = Path(chdir.split("=", 1)[1])
    command = argv[argv.index(chdir) + 1]
    if command == "init":
        (module / ".terraform").mkdir(exist_ok=True)
        print("Terraform has been successfully initialized!")
        return 0
    if command == "apply":
        return apply(module, argv)
    if command == "output":
        state = module / "terraform.tfstate"
        print(json.dumps(outputs(int(state.read_text()) if state.exists() else 0)))
        return 0
    print(f"stand-in terraform: unknown command {command}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
