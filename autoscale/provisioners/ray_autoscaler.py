"""The `ray_autoscaler` provisioner: asks Ray's autoscaler for nodes of the pool's resource
(`ray.autoscaler.sdk.request_resources`), so any `ray up` cluster launches its node type."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from autoscale.provisioners import (
    ProvisionFailed,
    ProvisionRequest,
    ProvisionResult,
    StandingRequest,
)
from core.config import RayAutoscalerProvisioner

RequestResources = Callable[..., Any]


def _ray_request_resources(**kwargs: Any) -> Any:
    from ray.autoscaler.sdk import request_resources

    return request_resources(**kwargs)


class AutoscalerRequest:
    def __init__(
        self,
        config: RayAutoscalerProvisioner,
        standing: StandingRequest,
        request_resources: RequestResources = _ray_request_resources,
    ) -> None:
        self._config = config
        self._standing = standing
        self._request_resources = request_resources

    async def provision(self, request: ProvisionRequest) -> ProvisionResult:
        bundle = {request.resource: 1.0, **self._config.resources}
        bundles = self._standing.set(request.pool, [dict(bundle)] * request.nodes)
        try:
            # A GCS call: off the event loop.
            await asyncio.to_thread(self._request_resources, bundles=bundles)
        except Exception as error:  # noqa: BLE001 - any failure of the ask is a failed attempt
            raise ProvisionFailed(f"request_resources failed: {error}") from None
        return ProvisionResult(
            detail=f"asked Ray's autoscaler for {request.nodes} x {bundle}",
            outputs={"bundles": bundles},
        )
