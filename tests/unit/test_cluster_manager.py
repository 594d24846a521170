"""The cluster manager's rounds without Ray: fake nodes, provisioners and a hand-turned clock."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoscale.cluster_manager import ClusterManager, ManagerPorts, pools_needing_gpu
from autoscale.probe import NodeSnapshot
from autoscale.provisioners import ProvisionFailed, ProvisionRequest, ProvisionResult
from autoscale.vram import NodeReading
from core.config import ClusterConfig, load_config
from tests.fakes.clock import FakeClock

CONFIG_YAML = """
pools:
  - {name: local, kind: local}
  - name: cloud
    kind: cloud
    provisioner: {type: command, command: ["./start-node"]}
models:
  - role: reasoning
    source: /models/demo
    context_window: 2048
    device: cpu
    pools: [cloud, local]
fallback:
  engine: llama_cpp
  source: /models/demo.gguf
cluster_manager:
  interval_s: 5
  dead_after_s: 30
  provision_timeout_s: 120
  max_attempts: 2
  backoff_s: 10
"""


def config(tmp_path: Path, extra: str = "") -> ClusterConfig:
    path = tmp_path / "cluster.yaml"
    path.write_text(CONFIG_YAML + extra)
    return load_config(path, environ={})


def node(node_id: str, pool: str, alive: bool = True, reading: bool = True) -> NodeSnapshot:
    return NodeSnapshot(
        node_id=node_id,
        alive=alive,
        address="10.0.0.1",
        pools=frozenset({pool}),
        reading=NodeReading(node_id, error="no NVIDIA GPU readable") if reading else None,
    )


@dataclass
class Nodes:
    table: dict[str, NodeSnapshot] = field(default_factory=dict)

    async def nodes(self) -> list[NodeSnapshot]:
        return list(self.table.values())


@dataclass
class Provisioner:
    """Adds a node to the table when asked (after `delay_rounds` of the clock), or fails, or
    never returns."""

    nodes: Nodes
    behaviour: str = "join"  # join | fail | hang
    requests: list[ProvisionRequest] = field(default_factory=list)
    cancelled: int = 0

    async def provision(self, request: ProvisionRequest) -> ProvisionResult:
        self.requests.append(request)
        if self.behaviour == "fail":
            raise ProvisionFailed("exit 3: quota exceeded")
        if self.behaviour == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        self.nodes.table[f"new-{request.attempt}"] = node(f"new-{request.attempt}", request.pool)
        return ProvisionResult(detail="started a node")


@dataclass
class Sink:
    sent: list[Mapping[str, Any]] = field(default_factory=list)

    def send(self, event: Mapping[str, Any]) -> None:
        self.sent.append(event)


def manager(
    cfg: ClusterConfig, behaviour: str = "join"
) -> tuple[ClusterManager, Nodes, Provisioner, FakeClock, Sink]:
    nodes = Nodes({"head": node("head", "local"), "c1": node("c1", "cloud")})
    provisioner = Provisioner(nodes, behaviour)
    clock, sink = FakeClock(0.0, advance=True), Sink()
    ports = ManagerPorts(
        nodes=nodes,
        provisioners={"local": provisioner, "cloud": provisioner},
        clock=clock,
        ray_address="127.0.0.1:6379",
        events=sink,
    )
    return ClusterManager(cfg, "app", ports), nodes, provisioner, clock, sink


async def rounds(mgr: ClusterManager, clock: FakeClock, seconds: float, step: float = 5) -> None:
    end = clock.now + seconds
    while clock.now < end:
        await mgr.run_once()
        await clock.sleep(step)
        await asyncio.sleep(0)  # let provisioning tasks run


def types(mgr: ClusterManager) -> list[str]:
    return [e["type"] for e in mgr.report()["events"]]


def test_a_dead_pool_is_drained_replaced_and_recovered(tmp_path: Path) -> None:
    async def scenario() -> None:
        mgr, nodes, provisioner, clock, sink = manager(config(tmp_path))
        await rounds(mgr, clock, 10)
        assert mgr.report()["pools"]["cloud"]["state"] == "healthy"
        assert mgr.report()["pools"]["cloud"]["nodes"] == [{"node_id": "c1", "address": "10.0.0.1"}]
        # As the GCS reports a dead node: no resources, so no pool of its own.
        nodes.table["c1"] = dataclasses.replace(node("c1", "cloud", alive=False), pools=frozenset())
        killed_at = clock.now
        await rounds(mgr, clock, 35)
        assert mgr.unhealthy_pools() == ["cloud"]
        assert "c1: node is dead" in types_detail(mgr, "POOL_DRAINING")
        drained = next(e for e in mgr.report()["events"] if e["type"] == "POOL_DRAINING")
        assert drained["at"] - (1_800_000_000.0 + killed_at) <= 30 + 5
        await rounds(mgr, clock, 20)
        assert types(mgr) == [
            "POOL_UNHEALTHY",
            "POOL_DRAINING",
            "NODE_PROVISIONING",
            "NODE_JOINED",
            "GPU_RECOVERED",
        ]
        [request] = provisioner.requests
        assert (request.pool, request.resource, request.nodes) == ("cloud", "pool_cloud", 1)
        assert request.ray_address == "127.0.0.1:6379"
        report = mgr.report()
        assert report["pools"]["cloud"]["state"] == "healthy"
        assert report["pools"]["cloud"]["dead_nodes"] == 1
        assert mgr.unhealthy_pools() == []
        recovered = report["events"][-1]
        assert recovered["seconds"] > 0
        assert [e["type"] for e in sink.sent] == types(mgr)  # each event reached the webhook

    asyncio.run(scenario())


def test_failing_provisioner_is_retried_then_the_pool_fails(tmp_path: Path) -> None:
    async def scenario() -> None:
        mgr, nodes, provisioner, clock, _ = manager(config(tmp_path), behaviour="fail")
        await mgr.run_once()
        del nodes.table["c1"]
        await rounds(mgr, clock, 200)
        assert len(provisioner.requests) == 2  # max_attempts
        pool = mgr.report()["pools"]["cloud"]
        assert pool["state"] == "failed"
        assert "quota exceeded" in pool["reason"]
        assert types(mgr)[-1] == "POOL_FAILED"

    asyncio.run(scenario())


def test_a_hanging_provisioner_never_blocks_a_round_and_is_cancelled(tmp_path: Path) -> None:
    async def scenario() -> None:
        mgr, nodes, provisioner, clock, _ = manager(config(tmp_path), behaviour="hang")
        await mgr.run_once()
        nodes.table["c1"] = node("c1", "cloud", reading=False)  # alive, probe silent
        await rounds(mgr, clock, 45)
        assert mgr.report()["pools"]["cloud"]["state"] == "provisioning"
        await rounds(mgr, clock, 130)  # past provision_timeout_s
        assert provisioner.cancelled == 1
        assert len(provisioner.requests) == 2
        assert "probe did not answer" in types_detail(mgr, "POOL_UNHEALTHY")
        await mgr.stop()
        await asyncio.sleep(0)
        assert provisioner.cancelled == 2  # stop cancels the attempt in flight

    asyncio.run(scenario())


def test_a_probe_late_once_is_forgiven_and_late_twice_makes_the_pool_unhealthy(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        mgr, nodes, _, clock, _ = manager(config(tmp_path))
        nodes.table["c1"] = node("c1", "cloud")
        await mgr.run_once()
        nodes.table["c1"] = node("c1", "cloud", reading=False)  # one late reply
        await rounds(mgr, clock, 1)
        assert "POOL_UNHEALTHY" not in types(mgr)
        assert mgr.report()["pools"]["cloud"]["state"] == "healthy"
        nodes.table["c1"] = node("c1", "cloud")  # it answers again: the count starts over
        await rounds(mgr, clock, 1)
        nodes.table["c1"] = node("c1", "cloud", reading=False)
        await rounds(mgr, clock, 1)
        assert "POOL_UNHEALTHY" not in types(mgr)
        await rounds(mgr, clock, 1)  # late twice in a row: distrusted, as a hung GPU's would be
        assert "probe did not answer" in types_detail(mgr, "POOL_UNHEALTHY")

    asyncio.run(scenario())


def types_detail(mgr: ClusterManager, type_: str) -> str:
    return str(next(e["detail"] for e in mgr.report()["events"] if e["type"] == type_))


def test_a_gpu_pool_needs_a_readable_gpu(tmp_path: Path) -> None:
    gpu = config(tmp_path).model_copy(deep=True)
    data = gpu.model_dump(mode="json", exclude={"base_dir"})
    data["models"][0]["device"] = "gpu"
    gpu_config = ClusterConfig.model_validate(data)
    assert pools_needing_gpu(gpu_config) == frozenset({"cloud", "local"})

    async def scenario() -> None:
        mgr, _, _, clock, _ = manager(gpu_config)
        await rounds(mgr, clock, 40)
        # No GPU on either pool's node: local (no provisioner) stays drained, cloud is replaced.
        assert mgr.report()["pools"]["local"]["state"] == "draining"
        assert mgr.report()["pools"]["cloud"]["state"] == "provisioning"
        assert "no NVIDIA GPU readable" in types_detail(mgr, "POOL_UNHEALTHY")

    asyncio.run(scenario())
