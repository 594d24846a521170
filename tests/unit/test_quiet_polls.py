"""Successful router polls leave no access-log line; everything else still logs."""

from __future__ import annotations

import logging

import pytest

from deployments.engine.quiet_polls import quiet_polls


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


def test_httpx_request_lines_are_quiet_and_its_warnings_still_log(
    serve_logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # everything else at INFO logs
    client_log = logging.getLogger("httpx")
    client_log.info('HTTP Request: GET http://127.0.0.1:52157/health "HTTP/1.1 200 OK"')
    client_log.warning("connection pool is full")
    assert [r.getMessage() for r in caplog.records if r.name == "httpx"] == [
        "connection pool is full"
    ]
