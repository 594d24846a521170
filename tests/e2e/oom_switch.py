"""The model replica with a fault switch (in the style of Ray's test_healthcheck.py): when it is
on, the engine raises `torch.OutOfMemoryError` inside the replica, as a CUDA engine that ran out
of memory does. Everything else is the production ObservedLLMServer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from deployments.engine.llm_server import ObservedLLMServer


class OomSwitchLLMServer(ObservedLLMServer):
    async def __init__(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[misc]
        await super().__init__(*args, **kwargs)
        self._out_of_memory = False
        real_chat = self.engine.chat

        async def chat(request: Any, raw_request_info: Any = None) -> AsyncIterator[Any]:
            if self._out_of_memory:
                import torch

                raise torch.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test switch)"
                )
            async for item in real_chat(request, raw_request_info):
                yield item

        self.engine.chat = chat

    async def set_out_of_memory(self, on: bool) -> None:
        self._out_of_memory = on
