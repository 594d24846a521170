"""The gateway driven by LangChain (`langchain-openai`), a client nobody here wrote: a chat, a
stream, a tool bound and forced, its result sent back, a legacy completion, and embeddings."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAI, OpenAIEmbeddings
from pydantic import SecretStr

API_KEY = "test-user-key"  # its sha256 is in gateway.yaml


@tool
def get_weather(city: Literal["Paris", "Oslo", "Rome"]) -> str:
    """The weather in a city now."""
    return f"It is sunny in {city}."


@pytest.fixture
def chat(gateway: str) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{gateway}/v1",
        api_key=API_KEY,
        model="smollm2",
        max_tokens=60,
        temperature=0,
        max_retries=0,
    )


def test_a_chat_and_a_stream(chat: ChatOpenAI) -> None:
    answer = chat.invoke("Say hello.")
    assert isinstance(answer.content, str)
    assert answer.content
    streamed = "".join(str(chunk.content) for chunk in chat.stream("Count to three."))
    assert streamed


def test_a_bound_tool_is_called_and_its_result_answered(chat: ChatOpenAI) -> None:
    forced = chat.bind_tools([get_weather], tool_choice="get_weather")
    question = HumanMessage("What is the weather in Paris?")
    called = forced.invoke([question])
    [call] = called.tool_calls
    assert call["name"] == "get_weather"
    assert call["args"]["city"] in {"Paris", "Oslo", "Rome"}
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = chat.bind_tools([get_weather]).invoke([question, called, result])
    assert answer.content or answer.tool_calls


def test_a_legacy_completion(gateway: str) -> None:
    llm: Any = OpenAI(
        base_url=f"{gateway}/v1", api_key=API_KEY, model="smollm2", max_tokens=8, max_retries=0
    )
    text = llm.invoke("def add(a, b):\n    ")
    assert isinstance(text, str)
    assert text


def test_documents_and_a_query_are_embedded(gateway: str) -> None:
    embeddings = OpenAIEmbeddings(
        openai_api_base=f"{gateway}/v1",
        openai_api_key=SecretStr(API_KEY),
        model="smollm2-embed",
        dimensions=128,
        # LangChain's documented setting for models that are not OpenAI's: send the text, not
        # tiktoken's ids of it (another vocabulary).
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    documents = embeddings.embed_documents(["Paris is in France.", "Oslo is in Norway."])
    query = embeddings.embed_query("Paris is in France.")
    assert [len(vector) for vector in documents] == [128, 128]
    assert query == pytest.approx(documents[0], abs=1e-2)
