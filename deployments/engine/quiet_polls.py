"""The router's polls leave no access-log line when they succeed.

Serve writes one access-log line per handle call. The router reads every engine's KV-cache usage
each second and probes troubled links, so a 40-minute run wrote 7,700 `CALL kv_cache_usage OK`
lines that buried the real warnings. Failed polls still log, and so does everything else. The
same goes for httpx's INFO line per request (the CPU fallback's health checks of its engine
server): its failures raise and are logged where they are caught.
"""

from __future__ import annotations

import logging
import re

POLLED_METHODS = ("kv_cache_usage", "engine_counters", "check_health")
# `CALL kv_cache_usage OK 4.2ms`, after the client's address with RAY_SERVE_LOG_CLIENT_ADDRESS.
_QUIET = re.compile(rf"^(?:\S+ )?CALL (?:{'|'.join(POLLED_METHODS)}) OK ")


class QuietPolls(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "serve_access_log", False):
            return True
        return _QUIET.match(record.getMessage()) is None


def quiet_polls(logger: logging.Logger | None = None) -> None:
    """Install the filter on Serve's logger in this replica's process (once)."""
    target = logger or logging.getLogger("ray.serve")
    if not any(isinstance(f, QuietPolls) for f in target.filters):
        target.addFilter(QuietPolls())
    logging.getLogger("httpx").setLevel(logging.WARNING)
