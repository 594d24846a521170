"""The Router deployment: picks the backend for each job and relays the engine's answer.

This issue's router resolves a role to the first deployed link of its failover chain. Admission
(priority queue, caps), breakers and failover build on this shape in later issues. It keeps its
state in memory, so the app runs exactly one router replica (`gateway.router_replicas`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle

from cluster.config import Backend, ClusterConfig, Role
from deployments.context.counters import counters_by_role
from deployments.context.fit import ContextOverflow, Fit, fit_messages
from deployments.messages import ChatJob, Refusal, Routed

logger = logging.getLogger("ray.serve")


def first_deployed_link(chain: tuple[str, ...], deployed: Mapping[str, Any]) -> str | None:
    return next((link for link in chain if link in deployed), None)


def stream_error_event(message: str) -> list[str]:
    """An SSE error event and the terminator, for failures after the first token was sent."""
    error = {"error": {"message": message, "type": "server_error", "code": "backend_failed"}}
    return [f"data: {json.dumps(error)}\n\n", "data: [DONE]\n\n"]


class Router:
    def __init__(self, config: ClusterConfig, backends: Mapping[str, DeploymentHandle]) -> None:
        self._config = config
        # Configured handles are cached: each .options() call builds a new Serve router.
        self._handles = {name: handle.options(stream=True) for name, handle in backends.items()}
        self._in_flight: Counter[str] = Counter()
        self._counters = counters_by_role(config)
        self._backends = {b.name: b for b in config.backends}

    def _fit(self, job: ChatJob, role: Role) -> Fit:
        request = job.request
        return fit_messages(
            [dict(m) for m in request.messages],
            window=max(1, int(self._config.model_for(role).context_window * job.context_share)),
            requested_max_tokens=(
                request.max_completion_tokens
                if request.max_completion_tokens is not None
                else request.max_tokens
            ),
            counter=self._counters[role],
        )

    async def chat(self, job: ChatJob) -> AsyncIterator[Any]:
        backend = first_deployed_link(self._config.chain(job.role), self._handles)
        if backend is None:
            yield Refusal(503, "no_backend", f"No backend is deployed for {job.role.value!r}.")
            return
        # A chain may end on another role's backend: fit to, and ask for, what actually serves.
        role = self._backends[backend].role
        try:
            fit = self._fit(job, role)
        except ContextOverflow as overflow:
            yield Refusal(400, "context_length_exceeded", str(overflow))
            return
        except Exception as error:  # a chat template that rejects the messages (roles, order)
            yield Refusal(400, "invalid_request", f"The messages cannot be rendered: {error}")
            return
        yield Routed(
            backend=backend,
            max_tokens=fit.max_tokens,
            prompt_tokens=fit.prompt_tokens,
            context_fitted=fit.fitted,
            dropped_messages=fit.dropped_messages,
            system_compressed=fit.system_compressed,
            output_clamped=fit.output_clamped,
        )
        # vLLM answers to the backend's model id, which is the role name.
        request = job.request.model_copy(
            update={
                "model": role.value,
                "messages": fit.messages,
                "max_tokens": fit.max_tokens,
                "max_completion_tokens": fit.max_tokens,
            }
        )
        self._in_flight[backend] += 1
        started = False
        try:
            async for item in self._handles[backend].chat.remote(request):
                started = True
                yield item
        except (RayError, RayServeException) as error:
            logger.warning("backend %s failed: %s", backend, error)
            if started:
                yield stream_error_event(f"The backend {backend} failed mid-response.")
            else:
                yield Refusal(503, "backend_unavailable", f"The backend {backend} is unavailable.")
        finally:
            self._in_flight[backend] -= 1

    async def status(self) -> dict[str, Any]:
        """Per-backend state from Serve's own deployment status, plus in-flight counts."""
        # serve.status() blocks on the controller: keep it off the routing event loop.
        overview = await asyncio.to_thread(serve.status)
        app = overview.applications.get(serve.get_replica_context().app_name)
        deployments = app.deployments if app else {}
        backends = {}
        for backend in self._config.home_backends:
            info = deployments.get(backend.deployment_name)
            backends[backend.name] = _backend_status(backend, info, self._in_flight[backend.name])
        states = [b["state"] for b in backends.values()]
        return {"status": overall_status(states), "backends": backends}


def _backend_status(backend: Backend, info: Any, in_flight: int) -> dict[str, Any]:
    running = info.replica_states.get("RUNNING", 0) if info else 0
    status = str(info.status.value) if info else "NOT_DEPLOYED"
    return {
        "role": backend.role.value,
        "pool": backend.pool,
        "state": backend_state(status, running),
        "deployment_status": status,
        "running_replicas": running,
        "in_flight": in_flight,
    }


def backend_state(deployment_status: str, running_replicas: int) -> str:
    """up: healthy and serving; degraded: serving with trouble; starting; down."""
    if running_replicas and deployment_status == "HEALTHY":
        return "up"
    if running_replicas:
        return "degraded"
    return "starting" if deployment_status in {"UPDATING", "UPSCALING"} else "down"


def overall_status(states: list[str]) -> str:
    """ok when every backend is up, down when none serves, degraded in between."""
    if states and all(s == "up" for s in states):
        return "ok"
    return "degraded" if any(s in {"up", "degraded"} for s in states) else "down"
