"""Counting and cutting a raw completions prompt with the demo model's real tokenizer: what
`/v1/completions` fitting stands on."""

from __future__ import annotations

from pathlib import Path

from policy.context.prompt_fit import fit_prompt
from policy.context.tokens import ChatTemplateCounter

MODEL = Path(__file__).parents[2] / ".models" / "SmolLM2-135M-Instruct"


def test_the_end_kept_is_the_texts_own_end_and_within_the_count() -> None:
    counter = ChatTemplateCounter.from_pretrained(MODEL)
    text = "".join(f"value_{i} = compute({i}) * 3.14\n" for i in range(400)) + "total = value_399 +"
    kept = counter.tail(text, 100)
    assert text.endswith(kept)
    assert 90 <= counter.count_raw(kept) <= 101
    assert counter.fim_markers() is None  # SmolLM2 has no fill-in-the-middle tokens
    fit = fit_prompt(text, window=512, requested_max_tokens=64, counter=counter)
    assert isinstance(fit.prompt, str)
    assert text.endswith(fit.prompt)
    assert fit.prompt_tokens == counter.count_raw(fit.prompt)
    assert fit.prompt_tokens + fit.max_tokens <= 512
    assert fit.max_tokens == 64
