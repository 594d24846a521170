"""How a dead pool is replaced: each pool's provisioner, and the cluster manager's timings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from core.config.base import EnvVars, Frozen, FrozenDict

__all__ = [
    "ClusterManagerConfig",
    "CommandProvisioner",
    "NoProvisioner",
    "ProvisionerConfig",
    "RayAutoscalerProvisioner",
    "TerraformProvisioner",
]


class NoProvisioner(Frozen):
    """Nothing replaces the pool's nodes: it is drained and reported until a node joins."""

    type: Literal["none"] = Field("none", description="Nothing replaces the pool's nodes.")


class CommandProvisioner(Frozen):
    """Runs `command` (argv, no shell) with GPS_POOL, GPS_RAY_ADDRESS, GPS_POOL_RESOURCE and
    GPS_NODES in its environment: the escape hatch for on-prem and mesh nodes. Exit 0 means the
    node was asked for; the pool recovers when the node joins."""

    type: Literal["command"] = Field(description="Run a command of yours.")
    command: tuple[str, ...] = Field(min_length=1, description="argv, run without a shell.")
    env: EnvVars = Field(default_factory=FrozenDict, description="More environment for it.")
    nodes: int = Field(1, ge=1, description="Nodes the pool should have.")


class RayAutoscalerProvisioner(Frozen):
    """Asks Ray's autoscaler (`ray.autoscaler.sdk.request_resources`) for `nodes` bundles of
    the pool's resource: a `ray up` cluster launches its node type for the pool."""

    type: Literal["ray_autoscaler"] = Field(description="Ask Ray's autoscaler.")
    nodes: int = Field(1, ge=1, description="Nodes the pool should have.")
    resources: Annotated[dict[str, float], BeforeValidator(dict)] = Field(
        default_factory=dict,
        description='More resources each node must bring (e.g. {"GPU": 1}), so the autoscaler '
        "picks the right node type when several carry the pool resource.",
    )


class TerraformProvisioner(Frozen):
    """Runs `terraform apply` in `module_dir` with the pool's node count as a variable, and
    reads the module's outputs (`terraform output -json`)."""

    type: Literal["terraform"] = Field(description="Run terraform apply on a module.")
    module_dir: str = Field(min_length=1, description="The module, relative to the config file.")
    nodes: int = Field(1, ge=1, description="Nodes the pool should have.")
    count_variable: str = Field(
        "node_count",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The module's variable that gets the node count.",
    )
    variables: EnvVars = Field(default_factory=FrozenDict, description="More -var NAME=VALUE.")
    binary: str = Field("terraform", min_length=1, description="The terraform binary to run.")


def _shorthand(value: Any) -> Any:
    """`provisioner: ray_autoscaler` is `provisioner: {type: ray_autoscaler}`."""
    return {"type": value} if isinstance(value, str) else value


class _ShorthandSchema:
    """The JSON Schema admits the shorthand too: the types that need no other field, by name."""

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        names = {"type": "string", "enum": ["none", "ray_autoscaler"]}
        return {"anyOf": [names, handler(schema)]}


ProvisionerConfig = Annotated[
    NoProvisioner | CommandProvisioner | RayAutoscalerProvisioner | TerraformProvisioner,
    BeforeValidator(_shorthand),
    Field(discriminator="type"),
    _ShorthandSchema(),
]


class ClusterManagerConfig(Frozen):
    """The detached actor that notices a dead pool, drains it and has it replaced."""

    interval_s: float = Field(5.0, gt=0, description="Between looks at the nodes.")
    dead_after_s: float = Field(
        30.0,
        ge=0,
        description="A pool none of whose nodes is alive and passes its probe for this long is "
        "drained.",
    )
    provision_timeout_s: float = Field(
        900.0,
        gt=0,
        description="One provisioning attempt: the provisioner's call and the node joining.",
    )
    max_attempts: int = Field(3, ge=1, description="Attempts before the pool is failed.")
    backoff_s: float = Field(30.0, ge=0, description="Before retry n: backoff_s * 2**(n-1).")
    webhook_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="Each event POSTed there as JSON (retried, never blocking).",
    )
    max_events: int = Field(200, ge=1, description="Events kept for /v1/cluster/status.")
