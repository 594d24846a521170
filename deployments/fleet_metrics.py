"""Metrics that sum over replicas and nodes: each one recorded twice.

- In this process's `prometheus_client` registry: the single-process `/metrics` the ingress
  serves. Right for one replica on a laptop; with several ingress replicas successive scrapes
  through the Serve proxy come from different replicas, so counters look reset.
- Through Ray's metrics pipeline (`ray.util.metrics`, as Serve's own metrics go): each node's
  metrics agent exports every worker's series with its `WorkerId`, at the targets Ray lists in
  its service discovery file, so `sum`/`rate` in Prometheus add replicas and nodes up. Ray names
  them `ray_gps_*`; the shipped Prometheus config renames them back to `gps_*`.

A counter of a replica that died stays at its last value in its node's agent while a new
replica counts from zero in a series of its own: a sum over replicas never goes backwards.
Ray has no way to remove a gauge's series: `forget` drops it from the local registry and sets
Ray's to 0 (a gauge it exports is re-sent at its last value for the worker's life).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry
from ray.util import metrics as ray_metrics

__all__ = ["Counter", "Gauge", "Histogram", "ray_metrics"]


class _Metric:
    """A metric under one name in both sinks; `labels(...)` children cached per label values.
    `KIND` names the class in prometheus_client and in ray.util.metrics alike."""

    KIND = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float] | None = None,
    ) -> None:
        local_options: dict[str, Any] = {"registry": registry}
        ray_options: dict[str, Any] = {"tag_keys": tuple(labelnames)}
        if buckets is not None:
            local_options["buckets"] = buckets
            ray_options["boundaries"] = list(buckets)
        local = getattr(prometheus_client, self.KIND)
        self._local = local(name, documentation, labelnames, **local_options)
        # prometheus_client exports a counter as `name_total`; Ray adds `_total` itself.
        self._ray = getattr(ray_metrics, self.KIND)(name, documentation, **ray_options)
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], _Child] = {}

    def labels(self, *labelvalues: object) -> _Child:
        # Strings already (the usual call, per request): found as given.
        child = self._children.get(labelvalues)  # type: ignore[arg-type]
        if child is not None:
            return child
        # Strings, as prometheus_client makes them (Ray refuses any other tag value).
        values = tuple(str(value) for value in labelvalues)
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"expected labels {self._labelnames}, got {values}")
            tags = dict(zip(self._labelnames, values, strict=True))
            child = _Child(self._local.labels(*values), self._ray, tags)
            self._children[values] = child
        return child


class _Child:
    __slots__ = ("_local", "_ray", "_tags")

    def __init__(self, local: Any, ray_metric: Any, tags: dict[str, str]) -> None:
        self._local, self._ray, self._tags = local, ray_metric, tags

    def inc(self, amount: float = 1.0) -> None:
        self._local.inc(amount)
        if amount > 0:  # Ray refuses 0 (prometheus_client takes it, and refuses below)
            self._ray.inc(amount, tags=self._tags)

    def observe(self, value: float) -> None:
        self._local.observe(value)
        self._ray.observe(value, tags=self._tags)

    def set(self, value: float) -> None:
        self._local.set(value)
        self._ray.set(value, tags=self._tags)


class Counter(_Metric):
    KIND = "Counter"


class Histogram(_Metric):
    KIND = "Histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        super().__init__(name, documentation, labelnames, registry, buckets)


class Gauge(_Metric):
    KIND = "Gauge"

    def forget(self, *labelvalues: object) -> None:
        """This series is no longer news: out of /metrics, 0 in Ray's pipeline."""
        values = tuple(str(value) for value in labelvalues)
        if values in self._children:
            self._children.pop(values)
            self._ray.set(0, tags=dict(zip(self._labelnames, values, strict=True)))
        with contextlib.suppress(KeyError):  # never set here, or forgotten already
            self._local.remove(*values)
