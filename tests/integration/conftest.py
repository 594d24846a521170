"""Integration tests: real tokenizers, real engine processes, real signals; no Ray.

They need `make model` (the demo model and its GGUF) and take tens of seconds; tests/unit
needs neither.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from policy.context.tokens import ChatTemplateCounter

DEMO_MODEL = Path(__file__).parents[2] / ".models" / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def demo_counter() -> ChatTemplateCounter:
    """The demo model's own tokenizer and chat template (`make model` prepares it)."""
    if not (DEMO_MODEL / "tokenizer.json").is_file():
        pytest.fail(f"{DEMO_MODEL} is missing: run `make model` (make test does it)")
    return ChatTemplateCounter.from_pretrained(DEMO_MODEL)
