"""One token counter per served model, loaded once: its own tokenizer, or an estimate."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from core.topology import Target
from policy.context.tokens import CharEstimateCounter, ChatTemplateCounter, TokenCounter

__all__ = ["counters_for", "load_counter"]

logger = logging.getLogger("ray.serve")


def load_counter(source: str, chat_template: str | None = None) -> TokenCounter:
    """The model's tokenizer and chat template (a model folder, a hub id, or a GGUF file's
    embedded ones; the template in the file `chat_template` where given); the character
    estimate if none can load."""
    try:
        return ChatTemplateCounter.from_pretrained(source, chat_template)
    except Exception as error:  # noqa: BLE001 - any loader failure leaves us counting by estimate
        logger.warning("no tokenizer for %s (%s): counting by character estimate", source, error)
        return CharEstimateCounter()


def counters_for(targets: Iterable[Target]) -> dict[str, TokenCounter]:
    """A counter for each target's tokenizer and template (`Target.counter_key`), each loaded
    once."""
    counters: dict[str, TokenCounter] = {}
    for target in targets:
        if target.counter_key not in counters:
            counters[target.counter_key] = load_counter(target.tokenizer, target.chat_template)
    return counters
