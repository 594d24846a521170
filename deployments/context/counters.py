"""One token counter per served model, loaded once: its own tokenizer, or an estimate."""

from __future__ import annotations

import logging

from cluster.config import ClusterConfig, Role
from deployments.context.tokens import CharEstimateCounter, ChatTemplateCounter, TokenCounter

logger = logging.getLogger("ray.serve")


def load_counter(source: str) -> TokenCounter:
    """The model's tokenizer and chat template; the character estimate if it cannot load."""
    try:
        return ChatTemplateCounter.from_pretrained(source)
    except Exception as error:  # any loader failure leaves us counting by estimate
        logger.warning("no tokenizer for %s (%s): counting by character estimate", source, error)
        return CharEstimateCounter()


def counters_by_role(config: ClusterConfig) -> dict[Role, TokenCounter]:
    by_source: dict[str, TokenCounter] = {}
    counters = {}
    for model in config.models:
        source = config.resolve_path(model.source)
        if source not in by_source:
            by_source[source] = load_counter(source)
        counters[model.role] = by_source[source]
    return counters
