"""Successful router polls leave no access-log line; everything else still logs."""

from __future__ import annotations

import logging

import pytest

from deployments.quiet_polls import quiet_polls


@pytest.fixture
def serve_logger(caplog: pytest.LogCaptureFixture) -> logging.Logger:
    logger = logging.getLogger("gps-test-quiet-polls")
    quiet_polls(logger)
    quiet_polls(logger)  # installed once however often a replica calls it
    assert len(logger.filters) == 1
    caplog.set_level(logging.INFO, logger=logger.name)
    return logger


def access(logger: logging.Logger, line: str) -> None:
    logger.info(line, extra={"serve_access_log": True, "skip_context_filter": True})


def test_polls_that_succeed_are_quiet_and_the_rest_log(
    serve_logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    access(serve_logger, "CALL kv_cache_usage OK 4.2ms")
    access(serve_logger, "CALL check_health OK 1.0ms")
    access(serve_logger, "10.0.0.7:51234 CALL kv_cache_usage OK 3.0ms")  # client address on
    access(serve_logger, "CALL kv_cache_usage ERROR 2001.3ms")
    access(serve_logger, "CALL chat OK 395.7ms")
    serve_logger.info("CALL kv_cache_usage OK but not an access log")
    serve_logger.warning("engine stats are off")
    assert [r.getMessage() for r in caplog.records] == [
        "CALL kv_cache_usage ERROR 2001.3ms",
        "CALL chat OK 395.7ms",
        "CALL kv_cache_usage OK but not an access log",
        "engine stats are off",
    ]
