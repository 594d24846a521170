"""The monitoring suite's app: its config (pressure.yaml), address and test keys."""

from __future__ import annotations

from pathlib import Path

from core.config import ClusterConfig, load_config

CONFIG = Path(__file__).parent / "pressure.yaml"
PORT = 18900
APP = "pressure"
EXPORT_INTERVAL_S = 1  # Ray's metrics_report_interval_ms for this cluster
ADMIN_KEY = "monitoring-admin-key"  # pressure.yaml's `ops` (admin)
LOAD_KEY = "monitoring-load-key"  # pressure.yaml's `load`
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}
LOAD_HEADERS = {"Authorization": f"Bearer {LOAD_KEY}"}


def app_config(keys_db: Path) -> ClusterConfig:
    config = load_config(CONFIG, environ={})
    # The session's own files (a reload keeps both: tests/monitoring/test_reload.py).
    stored = keys_db.parent / "responses.sqlite3"
    gateway = config.gateway.model_copy(update={"keys_db": keys_db, "responses_db": stored})
    return config.model_copy(update={"gateway": gateway})
