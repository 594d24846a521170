"""The app the monitoring modules share: one Ray cluster of this suite's own, one engine, two
ingress replicas (tests/monitoring/pressure.yaml), the config's keys and a run-time keys file of
the session's own.

test_model_swap.py runs last: its reload takes the coding model away for another, and the
others' loads name it. It shares the app for its start (minutes of a vLLM engine and two ingress
replicas on 2 cores: as a suite of its own it made `make test`'s last phase longer than CI's 90
minutes allow, CI's run of 0b7c2de)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray import serve

from cluster.app import build_app
from core.config import ClusterConfig
from tests.local_ray import start_retrying, stop_serve_and_ray
from tests.monitoring.pressure_app import APP, EXPORT_INTERVAL_S, PORT, app_config

LAST_MODULE = "test_model_swap.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: Path(str(item.path)).name == LAST_MODULE)  # stable


@pytest.fixture(scope="session")
def keys_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("keys") / "keys.sqlite3"


@pytest.fixture(scope="session")
def app(keys_db: Path) -> Iterator[ClusterConfig]:
    # Ray turns OpenTelemetry's own log off; on, a worker's .err log says when an export
    # cycle missed its timeout and was dropped, which the count test reads. Every process of
    # the cluster inherits it from this one, which is this suite's own. (Not patch.dict: on
    # its way out it would also take what ray.init set there, its auth token among them.)
    os.environ["RAY_disable_open_telemetry_sdk_log"] = "0"  # noqa: SIM112 (Ray reads this case)
    start_retrying(
        lambda: ray.init(
            address="local",
            num_cpus=2,
            resources={"pool_local": 1},
            namespace="serve",
            # Each worker's metrics reach its agent every second (Ray's default is 10 s), as
            # often as Prometheus scrapes here: the rule's minute is 60 distinct samples. Its
            # cost: each export's timeout is 0.5 s (docs/operations.md, Monitoring).
            _system_config={"metrics_report_interval_ms": EXPORT_INTERVAL_S * 1000},
        )
    )
    config = app_config(keys_db)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app(config), name=APP, route_prefix="/")
    yield config
    stop_serve_and_ray()
