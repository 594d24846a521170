"""The router's polls leave no access-log line when they succeed.

Serve writes one access-log line per handle call. The router reads every engine's KV-cache usage
each second and probes troubled links, so a 40-minute run wrote 7,700 `CALL kv_cache_usage OK`
lines that buried the real warnings. Failed polls still log, and so does everything else.
"""

from __future__ import annotations

import logging

POLLED_METHODS = ("kv_cache_usage", "check_health")
_QUIET_PREFIXES = tuple(f"CALL {method} OK " for method in POLLED_METHODS)


class QuietPolls(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "serve_access_log", False):
            return True
        return not record.getMessage().startswith(_QUIET_PREFIXES)


def quiet_polls(logger: logging.Logger | None = None) -> None:
    """Install the filter on Serve's logger in this replica's process (once)."""
    target = logger or logging.getLogger("ray.serve")
    if not any(isinstance(f, QuietPolls) for f in target.filters):
        target.addFilter(QuietPolls())
