"""Images through the gateway to the vision role's model (the demo vision model, make model):
read and answered through chat, the Responses API and Anthropic's Messages API; sent to a text
model, read by the vision model; past gateway.media's limits, or by URL, a 400."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
from PIL import Image

from tests.e2e.gateway_calls import assert_openai_error, assert_serves, chat_body


def data_url(image: Image.Image) -> str:
    png = io.BytesIO()
    image.save(png, "PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


RED = data_url(Image.new("RGB", (64, 64), "red"))
NOISE = data_url(
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 48, 3), dtype=np.uint8))
)


def ask_about(http: httpx.Client, url: str, model: str = "vision") -> httpx.Response:
    parts = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in this picture?"},
    ]
    body = chat_body(model=model, messages=[{"role": "user", "content": parts}], temperature=0)
    return http.post("/v1/chat/completions", json=body)


def test_the_vision_model_reads_an_image_and_its_answer_depends_on_it(
    http: httpx.Client,
) -> None:
    answers = []
    for url in (RED, NOISE, RED):
        response = ask_about(http, url)
        assert response.status_code == 200, response.text
        assert response.headers["x-backend"] == "vision@local"
        # The engine counted the image's tiles: a square is 5 tiles of 64 tokens. The router
        # fitted the prompt by the same count (the engine's cost of an image of its size).
        prompt_tokens = response.json()["usage"]["prompt_tokens"]
        assert prompt_tokens > 5 * 64
        assert response.headers["x-prompt-tokens"] == str(prompt_tokens)
        answers.append(response.json()["choices"][0]["message"]["content"])
        if url == RED:
            whole_usage = response.json()["usage"]
    red, noise, red_again = answers
    assert red == red_again  # greedy: the same image, the same answer
    assert noise != red
    # Streamed, the same answer and the same count of the image's tokens.
    parts = [
        {"type": "image_url", "image_url": {"url": RED}},
        {"type": "text", "text": "What is in this picture?"},
    ]
    body = chat_body(model="vision", messages=[{"role": "user", "content": parts}], temperature=0)
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    pieces, usage = [], None
    with http.stream("POST", "/v1/chat/completions", json=body) as streamed:
        assert streamed.status_code == 200
        assert streamed.headers["x-backend"] == "vision@local"
        counted = int(streamed.headers["x-prompt-tokens"])
        for line in streamed.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            pieces += [c["delta"].get("content") or "" for c in chunk["choices"]]
            usage = chunk.get("usage") or usage
    assert "".join(pieces) == red
    assert usage is not None
    assert usage["prompt_tokens"] == whole_usage["prompt_tokens"] == counted


def test_a_conversation_of_images_over_the_window_loses_its_oldest_image_first(
    http: httpx.Client,
) -> None:
    # The vision window is 1,536 tokens; each image here is 333 and the answer about the first
    # about 960: with both images the prompt does not fit, without the first it does.
    answer = "The picture shows" + " a red square on white," * 160
    messages = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": RED}},
                                     {"type": "text", "text": "Describe this picture."}]},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": NOISE}},
                                     {"type": "text", "text": "And this one?"}]},
    ]  # fmt: skip
    body = chat_body(model="vision", messages=messages, max_tokens=16, temperature=0)
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-context-fitted"] == "true"
    assert response.headers["x-context-dropped-images"] == "1"
    assert response.headers["x-context-dropped-messages"] == "0"  # the words all stayed
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    assert response.headers["x-prompt-tokens"] == str(prompt_tokens)
    assert 1536 - 16 >= prompt_tokens > 960 + 333  # the newest image and the whole answer

    # Where the client says nothing may be cut (the Responses API's truncation: disabled),
    # the 400 names the window.
    def parts(url: str, text: str) -> list[dict[str, str]]:
        return [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": text}]

    conversation = [
        {"role": "user", "content": parts(RED, "Describe this picture.")},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": parts(NOISE, "And this one?")},
    ]
    body = {"model": "vision", "input": conversation, "truncation": "disabled", "store": False}
    error = assert_openai_error(
        http.post("/v1/responses", json=body), 400, "context_length_exceeded"
    )
    assert "1536 tokens" in error["message"]


def test_an_image_sent_to_a_text_model_is_read_by_the_vision_model(http: httpx.Client) -> None:
    response = ask_about(http, RED, model="smollm2")
    assert response.status_code == 200, response.text
    assert response.headers["x-backend"] == "vision@local"
    # The catalog says who reads them (the vision model, read from its config.json).
    cards = {card["id"]: card for card in http.get("/v1/models").json()["data"]}
    assert cards["vision"]["input_modalities"] == ["text", "image"]
    assert cards["smollm2"]["input_modalities"] == ["text"]


def test_images_past_the_gateways_limits_are_400s_that_name_them(http: httpx.Client) -> None:
    parts = [{"type": "image_url", "image_url": {"url": RED}}] * 3  # gateway.yaml takes 2
    body = chat_body(model="vision", messages=[{"role": "user", "content": parts}])
    error = assert_openai_error(
        http.post("/v1/chat/completions", json=body), 400, "invalid_request"
    )
    assert "gateway.media.max_images_per_request" in error["message"]
    text = "data:image/png;base64," + base64.b64encode(b"not a picture").decode()
    error = assert_openai_error(ask_about(http, text), 400, "invalid_request")
    assert "is not an image this gateway reads" in error["message"]
    assert_serves(http)


def test_an_image_by_url_is_refused_and_never_fetched(http: httpx.Client) -> None:
    response = ask_about(http, "http://169.254.169.254/latest/meta-data/")
    error = assert_openai_error(response, 400, "invalid_request")
    assert "data URL" in error["message"]
    assert error["param"] == "messages[0].content[0].image_url.url"
    assert_serves(http)


def test_the_responses_and_messages_apis_send_their_images_to_the_model(
    http: httpx.Client,
) -> None:
    question = {"type": "input_text", "text": "What is in this picture?"}
    body = {
        "model": "vision",
        "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": RED}, question]}
        ],
        "max_output_tokens": 8,
        "temperature": 0,
        "store": False,
    }
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-backend"] == "vision@local"
    assert response.json()["usage"]["input_tokens"] > 5 * 64  # the image's tiles were read
    source = {"type": "base64", "media_type": "image/png", "data": RED.partition(",")[2]}
    blocks = [{"type": "image", "source": source}, {"type": "text", "text": question["text"]}]
    body = {"model": "vision", "max_tokens": 8, "messages": [{"role": "user", "content": blocks}]}
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-backend"] == "vision@local"
    input_tokens = response.json()["usage"]["input_tokens"]
    assert input_tokens > 5 * 64
    # Anthropic's count_tokens counts the image as the engine read it.
    counted = http.post(
        "/v1/messages/count_tokens", json={"model": "vision", "messages": body["messages"]}
    )
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == input_tokens
    # A url source is Anthropic's own 400, naming the field: nothing is fetched.
    blocks[0] = {"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/a.png"}}
    refused = http.post("/v1/messages", json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "data URL" in refused.json()["error"]["message"]
