"""Context fitting: latency at 1k to 128k tokens, budget use, and the character-estimate anchor.

For conversations of about 1k, 8k, 32k and 128k tokens, of English prose only and of prose, code,
JSON and CJK text mixed (characters per token vary the way real traffic does), this fits each
into the demo model's window with its own tokenizer (exact) and reports:
- fit latency p50/p99, cold (a conversation never seen: every message tokenized) and warm (the
  same conversation plus one new turn: the content cache hits, as in a live chat session);
- the share of the available input budget the fitted prompt uses when the input overflows
  (target: at least 90%: we trim what we must, not more);
- the same conversations through a character-estimate fitter (about four characters a token, the
  anchors' approach), counted exactly afterwards: how often it overflows the window (the engine
  would answer 400) or wastes more than 10% of the budget.

Run with `make bench` or `python -m bench.context`. No Ray, no engine: this times the fitter.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from policy.context.fit import ContextOverflow, Fit, FitPolicy, fit_messages
from policy.context.tokens import CharEstimateCounter, ChatTemplateCounter, Message

MODEL = Path(__file__).resolve().parent.parent / ".models" / "SmolLM2-135M-Instruct"
WINDOW = 8192  # the demo model's window in ray_configs/local.yaml
MAX_TOKENS = 512
SIZES = (1_000, 8_000, 32_000, 128_000)
BUDGET_USE_TARGET = 0.90

WORDS = (
    "the router sheds background work first when a backend is full and every chain ends on a "
    "cpu replica that cannot run out of memory while the placement actor reads free vram and "
    "moves replicas between pools with hysteresis so that nothing flaps under load"
).split()
IDENTIFIERS = ("backend", "queue", "slot", "window", "tokens", "replica", "pool", "breaker")
CJK = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严"  # noqa: E501


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def code(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        a, b = rng.sample(IDENTIFIERS, 2)
        out.append(
            f"    if {a}_{i} > {rng.randint(0, 9999)}: {b}[{i}] = {a}_{i} * {rng.random():.4f}"
        )
    return "def step(state):\n" + "\n".join(out) + "\n    return state"


def json_blob(rng: random.Random, items: int) -> str:
    fields = ", ".join(
        f'"{rng.choice(IDENTIFIERS)}_{i}": {rng.randint(0, 10**6)}' for i in range(items)
    )
    return "{" + fields + "}"


def cjk(rng: random.Random, chars: int) -> str:
    return "".join(rng.choice(CJK) for _ in range(chars))


MAKERS: tuple[Callable[[random.Random], str], ...] = (
    lambda rng: prose(rng, rng.randint(60, 400)),
    lambda rng: code(rng, rng.randint(10, 60)),
    lambda rng: json_blob(rng, rng.randint(20, 120)),
    lambda rng: cjk(rng, rng.randint(50, 400)),
)


CONTENTS = {"mixed": MAKERS, "prose": MAKERS[:1]}


def conversation(
    rng: random.Random, tokens: int, counter: ChatTemplateCounter, content: str
) -> list[Message]:
    """A system message, alternating turns of `content`, and a short latest question."""
    messages: list[Message] = [{"role": "system", "content": prose(rng, 150)}]
    total = counter.count_text(messages[0]["content"])
    makers = CONTENTS[content]
    while total < tokens:
        for role in ("user", "assistant"):
            text = rng.choice(makers)(rng)
            messages.append({"role": role, "content": text})
            total += counter.count_text(text) + 5
    messages.append({"role": "user", "content": "Summarize the state of the cluster in one line."})
    return messages


@dataclass(frozen=True)
class SizeResult:
    content: str
    tokens: int
    cold_ms: list[float]
    warm_ms: list[float]
    budget_use: list[float]  # only where the input overflowed
    estimate_overflows: int
    estimate_wastes: int
    samples: int


def budget(fit: Fit, policy: FitPolicy) -> int:
    return WINDOW - fit.max_tokens - policy.margin_tokens


def measure(size: int, samples: int, tokenizer: object, seed: int, content: str) -> SizeResult:
    exact_policy = FitPolicy()
    # The anchors' fitter: four characters a token, no margin for its own error.
    estimate_policy = replace(FitPolicy(), estimate_margin_share=0.0)
    cold, warm, use = [], [], []
    overflows = wastes = 0
    for sample in range(samples):
        rng = random.Random(seed * 1000 + sample)
        reference = ChatTemplateCounter(tokenizer)
        messages = conversation(rng, size, reference, content)
        counter = ChatTemplateCounter(tokenizer)  # empty cache: a conversation never seen
        started = time.perf_counter()
        fit = fit_messages(
            messages, window=WINDOW, requested_max_tokens=MAX_TOKENS, counter=counter
        )
        cold.append((time.perf_counter() - started) * 1000)
        grown = [*messages[:-1], {"role": "assistant", "content": "One line."}, messages[-1]]
        started = time.perf_counter()
        fit_messages(grown, window=WINDOW, requested_max_tokens=MAX_TOKENS, counter=counter)
        warm.append((time.perf_counter() - started) * 1000)
        if fit.fitted:
            use.append(fit.prompt_tokens / budget(fit, exact_policy))
        try:
            estimated = fit_messages(
                messages,
                window=WINDOW,
                requested_max_tokens=MAX_TOKENS,
                counter=CharEstimateCounter(),
                policy=estimate_policy,
            )
        except ContextOverflow:
            continue
        actual = reference.count_prompt(estimated.messages)
        if actual + estimated.max_tokens > WINDOW:
            overflows += 1
        elif estimated.fitted and actual < BUDGET_USE_TARGET * budget(estimated, estimate_policy):
            wastes += 1
    return SizeResult(content, size, cold, warm, use, overflows, wastes, samples)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(results: list[SizeResult]) -> bool:
    print(f"\nContext fitting into a {WINDOW}-token window, max_tokens {MAX_TOKENS}")
    print(
        "| content | conversation | n | cold p50 ms | cold p99 ms | warm p50 ms | warm p99 ms "
        "| budget used (min / median) | char-estimate overflows | char-estimate wastes >10% |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    met = True
    for r in results:
        used = (
            f"{min(r.budget_use):.1%} / {statistics.median(r.budget_use):.1%}"
            if r.budget_use
            else "fits whole"
        )
        if r.budget_use and min(r.budget_use) < BUDGET_USE_TARGET:
            met = False
        print(
            f"| {r.content} | {r.tokens // 1000}k tokens | {r.samples} "
            f"| {percentile(r.cold_ms, 0.5):.1f} | {percentile(r.cold_ms, 0.99):.1f} "
            f"| {percentile(r.warm_ms, 0.5):.1f} | {percentile(r.warm_ms, 0.99):.1f} "
            f"| {used} | {r.estimate_overflows}/{r.samples} | {r.estimate_wastes}/{r.samples} |"
        )
    verdict = "met" if met else "MISSED"
    print(f"\nTarget: fitted prompts use >= {BUDGET_USE_TARGET:.0%} of the input budget: {verdict}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20, help="conversations per size")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if not MODEL.exists():
        print(f"{MODEL} is missing: run `make model` first", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
    results = []
    for content in CONTENTS:
        for size in SIZES:
            # Fewer samples of the largest sizes keep the run short.
            samples = max(5, args.samples * 8_000 // max(size, 8_000))
            results.append(measure(size, samples, tokenizer, args.seed, content))
            print(f"measured {content} {size} tokens ({samples} conversations)", file=sys.stderr)
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
