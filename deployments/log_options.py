"""Serve's `logging_config` for every deployment of the app: one encoding for all of them.

With `gateway.log_encoding: JSON` each Serve log line is one JSON object with the request's id
(`request_id`, the X-Request-ID of deployments/ingress/error_response.py), the application, the
deployment and the replica as fields, for a log pipeline that reads a fleet's lines; TEXT is
Serve's default.
"""

from __future__ import annotations

from typing import Any

from core.config import ClusterConfig

__all__ = ["serve_logging"]


def serve_logging(config: ClusterConfig, **settings: Any) -> dict[str, Any]:
    """The app's encoding, with a deployment's own `settings` (e.g. `enable_access_log`)."""
    return {"encoding": config.gateway.log_encoding, **settings}
