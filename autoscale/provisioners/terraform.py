"""The `terraform` provisioner: `terraform apply` in a module folder with the pool's node count
as a variable, read through Terraform's machine-readable UI (`-json`: one JSON object a line;
`diagnostic`, `change_summary` and `outputs` messages)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from autoscale.provisioners import ProvisionFailed, ProvisionRequest, ProvisionResult
from autoscale.provisioners.process import Done, run
from core.config import TerraformProvisioner


class TerraformApply:
    def __init__(self, config: TerraformProvisioner, base_dir: Path) -> None:
        self._config = config
        self._module = (base_dir / config.module_dir).resolve()

    def _argv(self, *args: str) -> list[str]:
        return [self._config.binary, f"-chdir={self._module}", *args]

    async def provision(self, request: ProvisionRequest) -> ProvisionResult:
        env = {**os.environ, "TF_IN_AUTOMATION": "1", "GPS_POOL": request.pool}
        if not (self._module / ".terraform").is_dir():
            init = await run(self._argv("init", "-input=false", "-no-color"), env, self._module)
            if init.returncode != 0:
                raise ProvisionFailed(f"terraform init failed: {Done.tail(init.stderr)}")
        variables = {self._config.count_variable: str(request.nodes), **self._config.variables}
        var_args = [arg for name, value in variables.items() for arg in ("-var", f"{name}={value}")]
        apply = await run(
            self._argv("apply", "-auto-approve", "-input=false", "-no-color", "-json", *var_args),
            env,
            self._module,
        )
        messages = list(_messages(apply.stdout))
        if apply.returncode != 0:
            errors = [
                m["diagnostic"].get("summary", "") + _detail(m["diagnostic"])
                for m in messages
                if m.get("type") == "diagnostic" and m["diagnostic"].get("severity") == "error"
            ]
            why = "; ".join(errors) or Done.tail(apply.stderr)
            raise ProvisionFailed(f"terraform apply exited {apply.returncode}: {why}")
        outputs = await self._outputs(messages, env)
        return ProvisionResult(detail=_summary(messages, request.nodes), outputs=outputs)

    async def _outputs(
        self, messages: list[dict[str, Any]], env: Mapping[str, str]
    ) -> dict[str, Any]:
        """The module's outputs: from apply's own `outputs` message, else `terraform output`."""
        for message in reversed(messages):
            if message.get("type") == "outputs":
                return _values(message.get("outputs", {}))
        done = await run(self._argv("output", "-json", "-no-color"), env, self._module)
        if done.returncode != 0:
            raise ProvisionFailed(f"terraform output failed: {Done.tail(done.stderr)}")
        try:
            return _values(json.loads(done.stdout or "{}"))
        except json.JSONDecodeError:
            raise ProvisionFailed("terraform output -json printed no JSON") from None


def _messages(stdout: str) -> Iterator[dict[str, Any]]:
    for line in stdout.splitlines():
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line of plain text among the JSON: not ours to parse
        if isinstance(message, dict):
            yield message


def _detail(diagnostic: Mapping[str, Any]) -> str:
    detail = str(diagnostic.get("detail") or "").strip()
    return f" ({detail.splitlines()[0]})" if detail else ""


def _values(outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {name: o.get("value") for name, o in outputs.items() if isinstance(o, dict)}


def _summary(messages: list[dict[str, Any]], nodes: int) -> str:
    for message in reversed(messages):
        if message.get("type") == "change_summary":
            c = message.get("changes", {})
            return (
                f"terraform: {c.get('add', 0)} added, {c.get('change', 0)} changed, "
                f"{c.get('remove', 0)} destroyed (node_count {nodes})"
            )
    return f"terraform apply done (node_count {nodes})"
