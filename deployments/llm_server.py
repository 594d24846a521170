"""`ray.serve.llm`'s LLMServer, plus the engine's KV-cache usage for the router's breaker.

vLLM computes `SchedulerStats.kv_cache_usage` (0..1) in its EngineCore process and hands it to
the frontend's stat loggers after every engine step; the Prometheus gauge
`vllm:kv_cache_usage_perc` is fed the same way but cannot be read back in-process. So we add one
stat logger of our own to the running engine and serve its last value by handle. An idle engine
sends no stats, and its last value (taken after its blocks were freed) stays true.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve.llm import LLMServer

logger = logging.getLogger("ray.serve")


class _KvCacheUsage:
    """A vLLM stat logger (duck-typed StatLoggerBase) that keeps the last KV-cache usage."""

    def __init__(self) -> None:
        self.usage = 0.0

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.usage = float(scheduler_stats.kv_cache_usage)

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


class ObservedLLMServer(LLMServer):  # type: ignore[misc]
    async def __init__(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[misc]
        await super().__init__(*args, **kwargs)
        self._kv_cache: _KvCacheUsage | None = None
        # AsyncLLM keeps its stat loggers in a plain list it walks after every step.
        manager = getattr(getattr(self.engine, "_engine_client", None), "logger_manager", None)
        if manager is None:
            logger.warning("engine stats are off: KV-cache usage will not be reported")
            return
        self._kv_cache = _KvCacheUsage()
        manager.stat_loggers.append(self._kv_cache)

    async def kv_cache_usage(self) -> float | None:
        """The engine's KV-cache usage (0..1) after its last step; None if not observable."""
        return None if self._kv_cache is None else self._kv_cache.usage
