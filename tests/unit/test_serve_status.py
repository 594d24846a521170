"""Serve's status as the router and the placement actor read it: replicas a new Serve controller
is re-attaching (after a restart of its own, or of the head) still serve."""

from __future__ import annotations

import asyncio

import pytest
from ray import serve
from ray.serve._private.common import DeploymentStatus, DeploymentStatusTrigger
from ray.serve.schema import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentStatusOverview,
    ServeStatus,
)

from autoscale.serve_status import ServeDeploymentStatus
from deployments.router.adapters.serve_ports import ServeDeploymentStatuses

APP, DEPLOYMENT = "gateway", "model:coding@local"


def reported(replica_states: dict[str, int]) -> ServeStatus:
    deployment = DeploymentStatusOverview(
        status=DeploymentStatus.UPDATING,
        status_trigger=DeploymentStatusTrigger.CONFIG_UPDATE_STARTED,
        replica_states=replica_states,
        message="",
    )
    app = ApplicationStatusOverview(
        status=ApplicationStatus.DEPLOYING,
        message="",
        last_deployed_time_s=0.0,
        deployments={DEPLOYMENT: deployment},
    )
    return ServeStatus(proxies={}, applications={APP: app})


@pytest.mark.parametrize(
    ("replica_states", "serving"),
    [
        ({"RECOVERING": 1}, 1),  # a new controller re-attaching a live replica
        ({"RUNNING": 1, "RECOVERING": 1}, 2),
        ({"PENDING_MIGRATION": 1, "STARTING": 1}, 1),  # on a draining node, until replaced
        ({"STARTING": 2, "STOPPING": 1}, 0),  # none of these answers requests
    ],
)
def test_replicas_that_serve_are_running_and_recovering_ones(
    monkeypatch: pytest.MonkeyPatch, replica_states: dict[str, int], serving: int
) -> None:
    monkeypatch.setattr(serve, "status", lambda: reported(replica_states))
    router_view = asyncio.run(ServeDeploymentStatuses().read())
    placer_view = asyncio.run(ServeDeploymentStatus(APP).health(DEPLOYMENT))
    assert router_view[(APP, DEPLOYMENT)].running_replicas == serving
    assert placer_view.running == serving
