"""deployments/fleet_metrics.py: one metric, two sinks. The local registry is read here; the
path through Ray's metrics agents is checked by a real Prometheus (tests/monitoring)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from prometheus_client import CollectorRegistry

from deployments import fleet_metrics
from deployments.fleet_metrics import Counter, Gauge, Histogram


class RaySink:
    """Stands in for one `ray.util.metrics` instrument: what was recorded, with which tags."""

    made: ClassVar[dict[str, RaySink]] = {}

    def __init__(self, name: str, *_: Any, tag_keys: tuple[str, ...] = (), **__: Any) -> None:
        self.name, self.tag_keys = name, tag_keys
        self.records: list[tuple[str, float, dict[str, str]]] = []
        RaySink.made[name] = self

    def inc(self, value: float, tags: dict[str, str]) -> None:
        self.records.append(("inc", value, tags))

    def observe(self, value: float, tags: dict[str, str]) -> None:
        self.records.append(("observe", value, tags))

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.records.append(("set", value, tags))


@pytest.fixture
def ray_sinks(monkeypatch: pytest.MonkeyPatch) -> dict[str, RaySink]:
    """Ray's instruments made while the test runs, by name."""
    for kind in ("Counter", "Gauge", "Histogram"):
        monkeypatch.setattr(fleet_metrics.ray_metrics, kind, RaySink)
    RaySink.made = {}
    return RaySink.made


def test_a_counter_counts_in_both_sinks_with_the_same_labels(ray_sinks: dict[str, RaySink]) -> None:
    registry = CollectorRegistry()
    requests = Counter("gps_t_requests", "Requests.", ["endpoint", "status"], registry=registry)
    requests.labels("chat", "200").inc()
    requests.labels("chat", "200").inc(2)
    requests.labels("chat", "429").inc()
    requests.labels("chat", "429").inc(0)  # nothing to add: Ray, which refuses 0, hears nothing
    assert (
        registry.get_sample_value("gps_t_requests_total", {"endpoint": "chat", "status": "200"})
        == 3
    )
    sink = ray_sinks["gps_t_requests"]
    assert sink.name == "gps_t_requests"  # Ray adds `_total` to a counter's name itself
    assert sink.tag_keys == ("endpoint", "status")
    assert sink.records == [
        ("inc", 1.0, {"endpoint": "chat", "status": "200"}),
        ("inc", 2, {"endpoint": "chat", "status": "200"}),
        ("inc", 1.0, {"endpoint": "chat", "status": "429"}),
    ]


def test_a_histogram_keeps_its_buckets_in_both_sinks(ray_sinks: dict[str, RaySink]) -> None:
    registry = CollectorRegistry()
    seconds = Histogram(
        "gps_t_seconds", "Seconds.", ["backend"], buckets=(0.1, 1), registry=registry
    )
    seconds.labels("a@local").observe(0.5)
    assert (
        registry.get_sample_value("gps_t_seconds_bucket", {"backend": "a@local", "le": "0.1"}) == 0
    )
    assert (
        registry.get_sample_value("gps_t_seconds_bucket", {"backend": "a@local", "le": "1.0"}) == 1
    )
    assert ray_sinks["gps_t_seconds"].records == [("observe", 0.5, {"backend": "a@local"})]


def test_a_forgotten_gauge_leaves_the_registry_and_reads_zero_in_rays(
    ray_sinks: dict[str, RaySink],
) -> None:
    registry = CollectorRegistry()
    usage = Gauge("gps_t_usage", "Usage.", ["backend"], registry=registry)
    usage.labels("a@local").set(0.9)
    usage.forget("a@local")
    usage.forget("b@local")  # never set: nothing to drop, nothing sent
    assert registry.get_sample_value("gps_t_usage", {"backend": "a@local"}) is None
    assert ray_sinks["gps_t_usage"].records == [
        ("set", 0.9, {"backend": "a@local"}),
        ("set", 0, {"backend": "a@local"}),
    ]
    usage.labels("a@local").set(0.5)  # set again after it was forgotten: back in both
    assert registry.get_sample_value("gps_t_usage", {"backend": "a@local"}) == 0.5


def test_the_wrong_number_of_labels_is_refused(ray_sinks: dict[str, RaySink]) -> None:
    registry = CollectorRegistry()
    requests = Counter("gps_t_refused", "Requests.", ["endpoint"], registry=registry)
    with pytest.raises(ValueError, match="expected labels"):
        requests.labels("chat", "200")


def test_a_label_given_as_a_number_is_the_same_series_as_its_text(
    ray_sinks: dict[str, RaySink],
) -> None:
    registry = CollectorRegistry()
    answers = Counter("gps_t_answers", "Answers.", ["status"], registry=registry)
    answers.labels(200).inc()
    answers.labels("200").inc()  # the usual call: found by its strings as given
    answers.labels(200).inc()
    assert registry.get_sample_value("gps_t_answers_total", {"status": "200"}) == 3
    assert [tags for _, _, tags in ray_sinks["gps_t_answers"].records] == [{"status": "200"}] * 3
