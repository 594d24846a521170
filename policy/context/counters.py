"""One token counter per served model, loaded once: its own tokenizer, or an estimate."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from core.topology import Target
from policy.context.tokens import CharEstimateCounter, ChatTemplateCounter, TokenCounter

__all__ = ["counters_for", "load_counter"]

logger = logging.getLogger("ray.serve")


def load_counter(source: str) -> TokenCounter:
    """The model's tokenizer and chat template (a model folder, a hub id, or a GGUF file's
    embedded ones); the character estimate if none can load."""
    try:
        return ChatTemplateCounter.from_pretrained(source)
    except Exception as error:  # noqa: BLE001 - any loader failure leaves us counting by estimate
        logger.warning("no tokenizer for %s (%s): counting by character estimate", source, error)
        return CharEstimateCounter()


def counters_for(targets: Iterable[Target]) -> dict[str, TokenCounter]:
    """A counter for each target's tokenizer source, each source loaded once."""
    counters: dict[str, TokenCounter] = {}
    for target in targets:
        if target.tokenizer not in counters:
            counters[target.tokenizer] = load_counter(target.tokenizer)
    return counters
