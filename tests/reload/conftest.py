"""The monitoring suite's app (tests/monitoring/conftest.py: one engine, two ingress replicas,
the pressure.yaml config) on a cluster of this suite's own. This suite runs alone, after the
ones beside the shared app: a reload here starts a second engine, and the machine's memory
has no room for it while the shared app's engines run (tests/suites.py)."""

from tests.monitoring.conftest import app, keys_db

__all__ = ["app", "keys_db"]
