"""Seeded bad and odd requests for POST /v1/chat/completions (`fuzz`), POST /v1/completions
(`fuzz_completions`) and POST /v1/embeddings (`fuzz_embeddings`), each labelled with its class.

Pure (no HTTP, no Ray): `fuzz(seed, count)` draws every request from one random.Random(seed),
so a failure replays from its seed and index. Most requests are malformed; the rest are valid
but odd, and ask for at most MAX_TOKENS tokens (never for a whole window), so the engines pay
little for them. Imported by path: tests are not a package.
"""

from __future__ import annotations

import base64
import json
import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_TOKENS = 4
MODELS = ("orchestrator", "smollm2", "auto")  # served by the e2e app (tests/e2e/gateway.yaml)
PROMPTS = ("Say hi.", "Reply with one word.", "2+2?", "Name a colour.")
JSON_HEADERS = {"Content-Type": "application/json"}
PLACEHOLDER = "__FUZZ__"
# A 1x1 PNG: image parts never send an engine to the network.
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def _png_claiming(width: int, height: int) -> str:
    """A PNG whose header claims `width` x `height` (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
        )

    size = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", size) + chunk(b"IDAT", zlib.compress(b"\0"))
    return "data:image/png;base64," + base64.b64encode(raw + chunk(b"IEND", b"")).decode()


# Malformed images: each the client's 400 at the edge, never an engine's error.
BAD_IMAGES = (
    PNG[:-24],  # truncated
    _png_claiming(60_000, 60_000),  # huge dimensions
    "data:image/png;base64,@@not-base64@@",
    "data:image/png;base64," + base64.b64encode(b"plain text, not a picture").decode(),
    PNG.replace("image/png", "text/plain"),  # wrong MIME
    "http://169.254.169.254/latest/meta-data/",  # a URL: never fetched
)
TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}

# What each class draws from: edges of every JSON type, valid values among them.
# fmt: off
ODD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1.5, 10**30, -(10**30), "", "x", "NaN", "4", [], [1], ["x"], {},
    {"a": 1},
)
# max_tokens has a class of its own: a missing one (null) would ask for most of the window.
FIELDS = (
    "model", "messages", "temperature", "top_p", "n", "stream", "stop", "seed", "tools",
    "tool_choice", "response_format", "stream_options", "logit_bias", "logprobs", "top_logprobs",
    "user", "presence_penalty", "frequency_penalty", "parallel_tool_calls", "reasoning_effort",
)
PART_TYPES = (
    "text", "image_url", "input_audio", "file", "refusal", "video_url", "audio_url",
    "image_embeds", "thinking", "input_text", "bogus", "", "TEXT", None, 7,
)
PART_PAYLOADS: dict[str, list[dict[str, Any]]] = {
    "image_url": [
        {"image_url": {"url": PNG}},
        {"image_url": PNG},
        {"image_url": {"url": 5}},
        *({"image_url": {"url": url}} for url in BAD_IMAGES),
    ],
    "input_audio": [{"input_audio": {"data": "AAAA", "format": "wav"}}, {"input_audio": {}}],
    "file": [{"file": {"file_data": "AAAA", "filename": "a.pdf"}}],
    "video_url": [{"video_url": {"url": "data:video/mp4;base64,AAAA"}}],
    "audio_url": [{"audio_url": {"url": "data:audio/wav;base64,AAAA"}}],
    "refusal": [{"refusal": "no"}],
}
PART_TEXTS: tuple[Any, ...] = (5, None, [], {}, True, ["a"], 1.5, "", "ok")
CONTENTS: tuple[Any, ...] = (
    {"text": "hi"}, {}, 5, True, None, [], [["hi"]], ["hi"], "", [None], 1.5,
)
DEPTHS = (8, 30, 63, 64, 65, 100, 1000, 5000, 100_000)
NUMBER_TOKENS = (
    "NaN", "Infinity", "-Infinity", "1e999", "-1e999", "-0", "1e-400", "9" * 5000, "9" * 300,
    "0.0000001", "1E2", "2.0",
)
NUMBER_FIELDS = ("temperature", "top_p", "max_tokens", "n", "seed", "presence_penalty")
# Never a valid large max_tokens: the router would clamp it to the window, a long answer.
MAX_TOKEN_VALUES: tuple[Any, ...] = (
    0, -1, -(10**9), 1.0, 2.5, "4", True, False, [4], 2**63, 10**19, 1, MAX_TOKENS,
)
ROLES: tuple[Any, ...] = (
    "bogus", "User", "function", "", None, 5, "model", "tool", "developer", "system",
    "assistant", ["user"],
)
TOOL_CHOICES: tuple[Any, ...] = (
    ["auto"], 5, "auto", "none", "required", "any", {"type": "function"}, {"type": "tool"},
    {"type": "function", "function": {}}, {"type": "function", "function": {"name": 5}},
    {"type": "function", "function": {"name": "get_time"}},
    {"type": "function", "function": {"name": "nope"}},
)
TOOLS: tuple[Any, ...] = (
    {}, [], [{}], [{"type": "function"}], [{"x": 1}], [{"type": "code_interpreter"}],
    [{"type": "function", "function": {"name": ""}}], [TOOL, 5], [TOOL],
    [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
)
STREAM_OPTIONS: tuple[Any, ...] = (
    [1], "x", True, 5, {}, {"include_usage": "yes"}, {"include_usage": True},
    {"continuous_usage_stats": 1}, None,
)
STOPS: tuple[Any, ...] = (
    5, [1], ["a"] * 5, "", [""], [["a"]], {"a": 1}, ["\n"], None, "x" * 5000, [None],
)
RANGES: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("temperature", (-1, 2.5, 3, 0, 2, 0.7)), ("top_p", (1.5, -0.1, 0, 1, 0.5)),
    ("presence_penalty", (5, -3, 2, -2)), ("frequency_penalty", (2.01, -2.5, 0)),
    ("n", (0, -1, 2, 129)), ("seed", (2**70, -(2**70), 42, -1)),
    ("logprobs", ("yes", 1, True)), ("top_logprobs", (30, -1, 5)),
)
LOGIT_BIASES: tuple[Any, ...] = (
    [], "x", {"x": 5}, {"15": 200}, {"15": "a"}, {"15": 5}, {"99999999": 1}, {"-1": 1},
    {"15": None}, {"\uff11\uff15": 1},
)
RESPONSE_FORMATS: tuple[Any, ...] = (
    {"type": "json_object"}, {"type": "xml"}, "json", {"type": "json_schema"}, {"type": "text"},
    {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}},
    {"type": "json_schema", "json_schema": {"schema": {}}}, [], {},
)
DUPLICATES = ('"model": "gpt-17"', '"messages": 5', '"max_tokens": -1', '"x": 1')
TEXTS = (
    "héllo wörld", "\U0001f600 hi", "مرحبا", "e\u0301\u0301\u0301", "a\u200bb\ufeff",
    "nul\u0000byte", "\ud800 lone", "lone \udfff", "\udc00\ud800", "\U0010ffff",
)
BAD_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"\xf8\x88\x80\x80")
NOT_OBJECTS = (b"[]", b'"x"', b"1", b"null", b"true", b"  ", b"", b"\x00", b"{", b"}", b"{}{}")
MESSAGE_COUNTS = (10_001, 20_000, 200, 31)
ASSISTANT_TURNS: tuple[dict[str, Any], ...] = (
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "assistant", "content": None}, {"role": "assistant", "tool_calls": {}},
    {"role": "assistant", "content": None, "tool_calls": [{"id": 1}]},
    {"role": "assistant", "content": "x", "tool_calls": [{**CALL, "function": 5}]},
)
TOOL_TURNS: tuple[dict[str, Any], ...] = (
    {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    {"role": "tool", "content": "12:00"}, {"role": "tool", "tool_call_id": 5},
)
CONTENT_TYPES = (
    "text/plain", "application/x-www-form-urlencoded", "application/json; charset=utf-16",
    "multipart/form-data; boundary=x", "", "application/xml",
)
# fmt: on

Body = dict[str, Any] | bytes  # a dict goes out as JSON, bytes as they are


@dataclass(frozen=True)
class FuzzRequest:
    kind: str
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON_HEADERS))
    path: str = "/v1/chat/completions"


def fuzz(seed: int, count: int) -> Iterator[FuzzRequest]:
    rng = random.Random(seed)
    kinds = sorted(MUTATIONS)
    for _ in range(count):
        kind = rng.choice(kinds)
        body = MUTATIONS[kind](rng, base_request(rng))
        headers = {"Content-Type": rng.choice(CONTENT_TYPES)} if kind == "content_type" else None
        yield FuzzRequest(kind, _encode(rng, body), headers or dict(JSON_HEADERS))


def base_request(rng: random.Random) -> dict[str, Any]:
    return {
        "model": rng.choice(MODELS),
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "max_tokens": rng.randint(1, MAX_TOKENS),
    }


def _encode(rng: random.Random, body: Body) -> bytes:
    if isinstance(body, bytes):
        return body
    # surrogatepass: a lone surrogate goes out as the bytes it would have (not UTF-8).
    return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def _with_raw(body: dict[str, Any], raw: str) -> bytes:
    """The body as JSON with `raw` text (maybe not JSON on its own) where the placeholder is."""
    return json.dumps(body).replace(f'"{PLACEHOLDER}"', raw).encode()


def _user(body: dict[str, Any], content: Any) -> dict[str, Any]:
    body["messages"] = [{"role": "user", "content": content}]
    return body


# -- the classes --------------------------------------------------------------------------------


def field_types(rng: random.Random, body: dict[str, Any]) -> Body:
    body[rng.choice(FIELDS)] = rng.choice(ODD_VALUES)
    return body


def part_types(rng: random.Random, body: dict[str, Any]) -> Body:
    kind = rng.choice(PART_TYPES)
    part: dict[str, Any] = {"type": kind, "text": "Say hi."}
    if isinstance(kind, str) and kind in PART_PAYLOADS and rng.random() < 0.8:
        part = {"type": kind, **rng.choice(PART_PAYLOADS[kind])}
    return _user(body, [{"type": "text", "text": "Describe it."}, part])


def part_text(rng: random.Random, body: dict[str, Any]) -> Body:
    part = {"type": "text", "text": rng.choice(PART_TEXTS)}
    if rng.random() < 0.15:
        del part["text"]
    return _user(body, [part])


def content_shape(rng: random.Random, body: dict[str, Any]) -> Body:
    return _user(body, rng.choice(CONTENTS))


def deep_nesting(rng: random.Random, body: dict[str, Any]) -> Body:
    depth = rng.choice(DEPTHS)
    raw = "[" * depth + "]" * depth if rng.random() < 0.5 else '{"a":' * depth + "1" + "}" * depth
    where = rng.randrange(5)
    if where == 0:
        return raw.encode()  # the whole body
    if where == 1:
        body["metadata"] = PLACEHOLDER
    elif where == 2:
        body["messages"][0]["content"] = PLACEHOLDER
    elif where == 3:
        body["tools"] = [{**TOOL, "function": {"name": "f", "parameters": PLACEHOLDER}}]
    else:
        body["response_format"] = PLACEHOLDER
    return _with_raw(body, raw)


def number_edges(rng: random.Random, body: dict[str, Any]) -> Body:
    token = rng.choice(NUMBER_TOKENS)
    name = rng.choice(NUMBER_FIELDS)
    if rng.random() < 0.3:  # the same, as a string
        body[name] = token[:50]
        return body
    if rng.random() < 0.2:
        body["logit_bias"] = {"15": PLACEHOLDER}
    else:
        body[name] = PLACEHOLDER
    return _with_raw(body, token)


def max_tokens(rng: random.Random, body: dict[str, Any]) -> Body:
    body[rng.choice(["max_tokens", "max_completion_tokens"])] = rng.choice(MAX_TOKEN_VALUES)
    return body


def roles(rng: random.Random, body: dict[str, Any]) -> Body:
    message: dict[str, Any] = {"role": rng.choice(ROLES), "content": "Say hi."}
    if rng.random() < 0.15:
        del message["role"]
    body["messages"] = [message] if rng.random() < 0.5 else [message, *body["messages"]]
    return body


def tool_choice(rng: random.Random, body: dict[str, Any]) -> Body:
    body["tool_choice"] = rng.choice(TOOL_CHOICES)
    if rng.random() < 0.6:
        body["tools"] = [TOOL]
    return body


def tools(rng: random.Random, body: dict[str, Any]) -> Body:
    body["tools"] = rng.choice(TOOLS)
    if rng.random() < 0.5:
        body["tool_choice"] = {"type": "function", "function": {"name": "f"}}
    return body


def stream_options(rng: random.Random, body: dict[str, Any]) -> Body:
    body["stream_options"] = rng.choice(STREAM_OPTIONS)
    stream = rng.choice([True, False, None, "true"])
    if stream is not None:
        body["stream"] = stream
    return body


def stop(rng: random.Random, body: dict[str, Any]) -> Body:
    body["stop"] = rng.choice(STOPS)
    return body


def sampling_ranges(rng: random.Random, body: dict[str, Any]) -> Body:
    name, values = rng.choice(RANGES)
    body[name] = rng.choice(values)
    if name == "top_logprobs" and rng.random() < 0.5:
        body["logprobs"] = True
    return body


def logit_bias(rng: random.Random, body: dict[str, Any]) -> Body:
    body["logit_bias"] = rng.choice(LOGIT_BIASES)
    return body


def response_format(rng: random.Random, body: dict[str, Any]) -> Body:
    body["response_format"] = rng.choice(RESPONSE_FORMATS)
    return body


def duplicate_keys(rng: random.Random, body: dict[str, Any]) -> Body:
    first, rest = rng.choice(DUPLICATES), json.dumps(body)[1:-1]
    return ("{" + (f"{rest}, {first}" if rng.random() < 0.5 else f"{first}, {rest}") + "}").encode()


def empty_fields(rng: random.Random, body: dict[str, Any]) -> Body:
    bodies: list[dict[str, Any]] = [
        {},
        {"model": body["model"]},
        {"messages": body["messages"]},
        {**body, "messages": []},
        {**body, "model": ""},
        {**body, "model": None},
        {key: None for key in body},
    ]
    return rng.choice(bodies)


def unicode(rng: random.Random, body: dict[str, Any]) -> Body:
    return _user(body, rng.choice(TEXTS))


def invalid_utf8(rng: random.Random, body: dict[str, Any]) -> Body:
    raw = json.dumps(_user(body, PLACEHOLDER)).encode()
    return raw.replace(PLACEHOLDER.encode(), b"say " + rng.choice(BAD_UTF8) + b" hi")


def truncated(rng: random.Random, body: dict[str, Any]) -> Body:
    raw = json.dumps(body).encode()
    return raw[: rng.randrange(len(raw))]


def not_object(rng: random.Random, body: dict[str, Any]) -> Body:
    return rng.choice([*NOT_OBJECTS, json.dumps([body]).encode()])


def many_messages(rng: random.Random, body: dict[str, Any]) -> Body:
    count = rng.choice(MESSAGE_COUNTS)
    turns = [{"role": ("user", "assistant")[i % 2], "content": "hi"} for i in range(count - 1)]
    body["messages"] = [*turns, {"role": "user", "content": "Say hi."}]
    return body


def content_type(rng: random.Random, body: dict[str, Any]) -> Body:
    """A good or broken body under a Content-Type that is not JSON's (see `fuzz`)."""
    return body if rng.random() < 0.7 else truncated(rng, body)


def tool_messages(rng: random.Random, body: dict[str, Any]) -> Body:
    closing = {"role": "user", "content": "Thanks."}
    turns = [rng.choice(ASSISTANT_TURNS), rng.choice(TOOL_TURNS), closing]
    body["messages"] = [*body["messages"], *turns]
    return body


MUTATIONS: dict[str, Callable[[random.Random, dict[str, Any]], Body]] = {
    mutate.__name__: mutate
    for mutate in (
        field_types, part_types, part_text, content_shape, deep_nesting, number_edges,
        max_tokens, roles, tool_choice, tools, stream_options, stop, sampling_ranges,
        logit_bias, response_format, duplicate_keys, empty_fields, unicode, invalid_utf8,
        truncated, not_object, many_messages, content_type, tool_messages,
    )
}  # fmt: skip


# -- /v1/completions ----------------------------------------------------------------------------

COMPLETION_PATH = "/v1/completions"
# fmt: off
COMPLETION_FIELDS = (
    "model", "prompt", "suffix", "echo", "logprobs", "n", "best_of", "stream", "stop", "seed",
    "temperature", "top_p", "stream_options", "logit_bias", "user", "presence_penalty",
)
PROMPT_SHAPES: tuple[Any, ...] = (
    "", [], [[]], [""], ["a", "b"], [1, 2, 3], [[1, 2]], [-1], [10**12], [1.5], [True], ["x", 1],
    [[1], [2]], [None], {"text": "hi"}, 5, None, [60_000], [0] * 3000, "def f():\n" * 2000,
    "\ud800", "<fim_prefix>x<fim_suffix>y<fim_middle>", [[[]]],
)
# fmt: on


def fuzz_completions(seed: int, count: int) -> Iterator[FuzzRequest]:
    return _drawn(seed, count, COMPLETION_MUTATIONS, base_completion, COMPLETION_PATH)


def _drawn(
    seed: int,
    count: int,
    mutations: dict[str, Callable[[random.Random, dict[str, Any]], Body]],
    base: Callable[[random.Random], dict[str, Any]],
    path: str,
) -> Iterator[FuzzRequest]:
    """`count` bodies for `path`, each a base one under a mutation class drawn from `seed`;
    labelled `<endpoint>.<class>`."""
    rng = random.Random(seed)
    kinds = sorted(mutations)
    endpoint = path.rsplit("/", 1)[-1]
    for _ in range(count):
        kind = rng.choice(kinds)
        body = mutations[kind](rng, base(rng))
        yield FuzzRequest(f"{endpoint}.{kind}", _encode(rng, body), path=path)


def base_completion(rng: random.Random) -> dict[str, Any]:
    return {
        "model": rng.choice(MODELS),
        "prompt": rng.choice(PROMPTS),
        "max_tokens": rng.randint(1, MAX_TOKENS),
    }


def completion_field_types(rng: random.Random, body: dict[str, Any]) -> Body:
    body[rng.choice(COMPLETION_FIELDS)] = rng.choice(ODD_VALUES)
    return body


def prompt_shapes(rng: random.Random, body: dict[str, Any]) -> Body:
    body["prompt"] = rng.choice(PROMPT_SHAPES)
    return body


def completion_options(rng: random.Random, body: dict[str, Any]) -> Body:
    """Valid-looking options in odd combinations: echo, logprobs, suffix, n, best_of, stream."""
    choices: dict[str, tuple[Any, ...]] = {
        "echo": (True, False),
        "logprobs": (0, 1, 5, 20, 21),
        "suffix": ("", "    return x", None),
        "n": (1, 2),
        "best_of": (1, 2, None),
        "stream": (True, False),
    }
    for name in rng.sample(sorted(choices), rng.randint(1, len(choices))):
        body[name] = rng.choice(choices[name])
    if body.get("stream") and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": rng.random() < 0.5}
    return body


def completion_numbers(rng: random.Random, body: dict[str, Any]) -> Body:
    return number_edges(rng, body)


def prompt_text(rng: random.Random, body: dict[str, Any]) -> Body:
    body["prompt"] = rng.choice(TEXTS)
    if rng.random() < 0.3:
        body["suffix"] = rng.choice(TEXTS)
    return body


def prompt_bytes(rng: random.Random, body: dict[str, Any]) -> Body:
    body["prompt"] = PLACEHOLDER
    raw = json.dumps(body).encode()
    return raw.replace(PLACEHOLDER.encode(), b"say " + rng.choice(BAD_UTF8) + b" hi")


def prompt_nesting(rng: random.Random, body: dict[str, Any]) -> Body:
    depth = rng.choice(DEPTHS)
    raw = "[" * depth + "1" + "]" * depth
    body[rng.choice(("prompt", "suffix", "stop"))] = PLACEHOLDER
    return _with_raw(body, raw)


COMPLETION_MUTATIONS: dict[str, Callable[[random.Random, dict[str, Any]], Body]] = {
    mutate.__name__: mutate
    for mutate in (
        completion_field_types, prompt_shapes, completion_options, completion_numbers, stop,
        sampling_ranges, logit_bias, duplicate_keys, prompt_text, prompt_bytes, truncated,
        not_object, prompt_nesting,
    )
}  # fmt: skip


# -- /v1/embeddings -----------------------------------------------------------------------------

EMBEDDING_PATH = "/v1/embeddings"
EMBEDDING_MODELS = ("embedding", "smollm2-embed", "smollm2", "auto")  # two that cannot embed
EMBEDDING_FIELDS = (
    "model", "input", "dimensions", "encoding_format", "truncate_prompt_tokens", "user",
    "truncation_side", "add_special_tokens", "use_activation", "embed_dtype", "priority",
    "stream", "stream_options", "max_tokens", "tools", "n",
)  # fmt: skip
INPUT_SHAPES: tuple[Any, ...] = (
    "", [], [""], [[]], [1, "a"], ["a", 1], [[1], "a"], [-1], [2**31], [[2**40]], [1.5], [True],
    {"text": "a"}, [None], [["a"]], ["a"] * 2049, [100_000], list(range(50)), [[5, 6], [7]],
    ["a", "b"], "a", [0],
)  # fmt: skip
EMBEDDING_OPTIONS: dict[str, tuple[Any, ...]] = {
    "dimensions": (0, -1, 1, 64, 576, 577, 10**9, 1.5, "64", True),
    "encoding_format": ("float", "base64", "bytes", "int8", "", None, 5),
    "truncate_prompt_tokens": (-2, -1, 0, 1, 8, 1024, 10**6, 1.5, "8", True),
    "truncation_side": ("left", "right", "middle", 5),
}


def fuzz_embeddings(seed: int, count: int) -> Iterator[FuzzRequest]:
    return _drawn(seed, count, EMBEDDING_MUTATIONS, base_embedding, EMBEDDING_PATH)


def base_embedding(rng: random.Random) -> dict[str, Any]:
    return {"model": rng.choice(EMBEDDING_MODELS), "input": rng.choice(PROMPTS)}


def embedding_field_types(rng: random.Random, body: dict[str, Any]) -> Body:
    body[rng.choice(EMBEDDING_FIELDS)] = rng.choice(ODD_VALUES)
    return body


def input_shapes(rng: random.Random, body: dict[str, Any]) -> Body:
    body["input"] = rng.choice(INPUT_SHAPES)
    return body


def embedding_options(rng: random.Random, body: dict[str, Any]) -> Body:
    """Valid-looking options in odd combinations, on a long input now and then."""
    for name in rng.sample(sorted(EMBEDDING_OPTIONS), rng.randint(1, len(EMBEDDING_OPTIONS))):
        body[name] = rng.choice(EMBEDDING_OPTIONS[name])
    if rng.random() < 0.3:  # over the e2e embedding model's window of 1024
        body["input"] = "word " * rng.choice((1000, 1100, 3000))
    return body


def input_text(rng: random.Random, body: dict[str, Any]) -> Body:
    body["input"] = rng.sample(TEXTS, rng.randint(1, 3))
    return body


def input_bytes(rng: random.Random, body: dict[str, Any]) -> Body:
    body["input"] = PLACEHOLDER
    raw = json.dumps(body).encode()
    return raw.replace(PLACEHOLDER.encode(), b'"say ' + rng.choice(BAD_UTF8) + b' hi"')


def input_nesting(rng: random.Random, body: dict[str, Any]) -> Body:
    depth = rng.choice(DEPTHS)
    body["input"] = PLACEHOLDER
    return _with_raw(body, "[" * depth + "1" + "]" * depth)


def embedding_numbers(rng: random.Random, body: dict[str, Any]) -> Body:
    body[rng.choice(("dimensions", "truncate_prompt_tokens"))] = PLACEHOLDER
    return _with_raw(body, rng.choice(NUMBER_TOKENS))


def other_endpoints_body(rng: random.Random, body: dict[str, Any]) -> Body:
    """A chat's or a completion's body sent here."""
    other = rng.choice(({"messages": [{"role": "user", "content": "hi"}]}, {"prompt": "hi"}))
    return {**(body if rng.random() < 0.5 else {"model": body["model"]}), **other}


EMBEDDING_MUTATIONS: dict[str, Callable[[random.Random, dict[str, Any]], Body]] = {
    mutate.__name__: mutate
    for mutate in (
        embedding_field_types, input_shapes, embedding_options, input_text, input_bytes,
        input_nesting, embedding_numbers, other_endpoints_body, duplicate_keys, truncated,
        not_object,
    )
}  # fmt: skip
