"""OpenAI's Responses API at the edge (deployments/ingress/responses): its requests as chat
bodies the chat path validates, chat answers as response objects, and chat streams as the
Responses events the `openai` SDK's own stream state accepts (it checks item identities,
order and indexes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from core.config import GatewayConfig
from core.errors import ApiError
from deployments.ingress.jobs import validate_chat
from deployments.ingress.responses.answer import to_response
from deployments.ingress.responses.events import ResponseEvents
from deployments.ingress.responses.request import ToolNames, to_chat

FIXTURES = Path(__file__).parents[1] / "fixtures" / "agent_requests"


def codex_request() -> dict[str, Any]:
    recorded = json.loads((FIXTURES / "codex_0.169.0_first.json").read_text())
    body: dict[str, Any] = recorded["body"]
    return body


def test_codexs_recorded_request_is_a_chat_the_chat_path_accepts() -> None:
    body = codex_request()
    translated = to_chat(body)
    chat = translated.chat
    validate_chat(dict(chat), GatewayConfig())
    roles = [m["role"] for m in chat["messages"]]
    # Its two leading developer messages (three parts) are one system message.
    assert roles == ["system", "user", "user"]
    assert chat["messages"][0]["content"].startswith("You are a coding agent")
    assert "<permissions instructions>" in chat["messages"][0]["content"]
    assert chat["messages"][-1]["content"] == "Reply OK"
    names = [t["function"]["name"] for t in chat["tools"]]
    # Functions kept, the namespace's functions flattened, web_search left out.
    assert "exec_command" in names
    assert "close_agent" in names
    assert len(names) == len(set(names))
    assert all(t["type"] == "function" for t in chat["tools"])
    assert (chat["tool_choice"], chat["stream"]) == ("auto", True)
    assert chat["stream_options"] == {"include_usage": True}
    assert chat["user"] == body["prompt_cache_key"]  # the session, for replica choice
    assert "max_tokens" not in chat  # fitting clamps it, as chat's
    assert not {"store", "include", "client_metadata", "reasoning"} & set(chat)


ON_IT = {"type": "output_text", "text": "On it."}
LS = '{"cmd": "ls"}'
OK_PART = {"type": "input_text", "text": "ok"}


def test_a_whole_conversation_with_calls_and_outputs_becomes_chat_turns() -> None:
    body = {
        "model": "coding",
        "instructions": "Be terse.",
        "input": [
            {"role": "user", "content": "List files, then patch."},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
            {"type": "message", "role": "assistant", "content": [ON_IT]},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": LS},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch",
             "input": "*** Begin"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": [OK_PART]},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"role": "developer", "content": "Mind the sandbox."},
            {"role": "user", "content": [{"type": "input_text", "text": "Now?"}]},
        ],
        "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object"}},
            {"type": "custom", "name": "apply_patch", "description": "Patch files.",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
            {"type": "web_search"},
        ],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "max_output_tokens": 64,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "reasoning": {"effort": "high", "summary": "auto"},
        "truncation": "auto",
    }  # fmt: skip
    translated = to_chat(body)
    chat = translated.chat
    validate_chat(dict(chat), GatewayConfig())
    assert chat["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "List files, then patch."},
        {
            "role": "assistant",
            "content": "On it.",
            "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}},
                {"id": "c2", "type": "function",
                 "function": {"name": "apply_patch", "arguments": '{"input": "*** Begin"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
        {"role": "system", "content": "Mind the sandbox."},
        {"role": "user", "content": "Now?"},
    ]  # fmt: skip
    assert translated.names.custom == frozenset({"apply_patch"})
    patch = chat["tools"][1]["function"]
    assert patch["parameters"]["required"] == ["input"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert (chat["max_tokens"], chat["reasoning_effort"]) == (64, "high")
    assert chat["response_format"]["type"] == "json_schema"
    assert chat["response_format"]["json_schema"]["name"] == "x"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [{"role": "bot", "content": "x"}]}, "input.0.role"),
        ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "input.0"),
        (
            {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}],
             "tool_choice": {"type": "function", "name": "g"}},
            "tool_choice.name",
        ),
        (
            {"model": "m", "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
            "input.0.content.0.image_url",
        ),
    ],
)  # fmt: skip
def test_what_the_responses_api_refuses_is_a_400_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(ApiError) as raised:
        to_chat(body)
    assert (raised.value.status, raised.value.param) == (400, param)


REQUEST = {"model": "coding", "input": "hi", "store": False}


def test_a_whole_answer_is_a_response_with_reasoning_message_and_calls() -> None:
    completion: dict[str, Any] = {
        "id": "chatcmpl-r1",
        "created": 1700000000,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "reasoning": "Think.",
                    "content": "Done.",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "shell", "arguments": '{"cmd":"ls"}'}},
                        {"id": "c2", "function": {"name": "apply_patch",
                                                  "arguments": '{"input": "*** Begin"}'}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }  # fmt: skip
    response = to_response(completion, REQUEST, ToolNames(frozenset({"apply_patch"})))
    assert (response["id"], response["object"], response["status"]) == (
        "resp_r1",
        "response",
        "completed",
    )
    assert (response["created_at"], response["model"], response["store"]) == (
        1700000000,
        "coding",
        False,
    )
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["reasoning", "message", "function_call", "custom_tool_call"]
    assert response["output"][1]["content"][0]["text"] == "Done."
    assert response["output"][2]["arguments"] == '{"cmd":"ls"}'
    assert response["output"][3]["input"] == "*** Begin"
    assert response["usage"]["total_tokens"] == 15
    cut = {**completion["choices"][0], "finish_reason": "length"}
    incomplete = to_response({**completion, "choices": [cut]}, REQUEST, ToolNames())
    assert incomplete["status"] == "incomplete"
    assert incomplete["incomplete_details"] == {"reason": "max_output_tokens"}


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "chatcmpl-s9", "created": 1700000001, "choices": [choice]}
    return "data: " + json.dumps(body) + "\n\n"


def calls(*pieces: dict[str, Any]) -> str:
    return chunk({"tool_calls": list(pieces)})


USAGE = 'data: {"id": "chatcmpl-s9", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 6}}\n\n'  # noqa: E501
PATCH_START = {"name": "apply_patch", "arguments": '{"input": '}
CHAT_STREAM = "".join(
    [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": "Hm"}),
        chunk({"reasoning": "m."}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        calls({"index": 0, "id": "c1", "function": {"name": "shell", "arguments": '{"cm'}}),
        calls({"index": 0, "function": {"arguments": 'd": "ls"}'}}),
        calls({"index": 1, "id": "c2", "function": PATCH_START}),
        calls({"index": 1, "function": {"arguments": '"*** Begin"}'}}),
        chunk({}, "tool_calls"),
        USAGE,
        "data: [DONE]\n\n",
    ]
)  # fmt: skip


def parsed_events(text: str) -> list[dict[str, Any]]:
    found = []
    for raw in text.split("\n\n"):
        if raw.strip():
            kind_line, data_line = raw.split("\n")
            data = json.loads(data_line.removeprefix("data: "))
            assert kind_line == f"event: {data['type']}"
            found.append(data)
    return found


@pytest.mark.parametrize("cut", [1, 13, len(CHAT_STREAM)])
def test_a_stream_is_events_the_openai_sdks_stream_state_accepts(cut: int) -> None:
    events = ResponseEvents(REQUEST, ToolNames(frozenset({"apply_patch"})))
    parts = [CHAT_STREAM[i : i + cut] for i in range(0, len(CHAT_STREAM), cut)]
    found = parsed_events("".join(events.feed(part) for part in parts) + events.end())
    assert [e["sequence_number"] for e in found] == list(range(len(found)))
    kinds = [e["type"] for e in found]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.custom_tool_call_input.delta" in kinds
    # The SDK's own accumulator: it raises on an item out of order, an index reused, or an id
    # that differs between the events and the completed response.
    state: ResponseStreamState[object] = ResponseStreamState(input_tools=omit, text_format=omit)
    for data in found:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=data))  # type: ignore[arg-type]
    final = found[-1]["response"]
    assert [i["type"] for i in final["output"]] == [
        "reasoning", "message", "function_call", "custom_tool_call",
    ]  # fmt: skip
    assert final["output"][1]["content"][0]["text"] == "Hello"
    assert final["output"][2]["arguments"] == '{"cmd": "ls"}'
    assert final["output"][3]["input"] == "*** Begin"
    assert final["usage"]["input_tokens"] == 8
    added = {e["item"]["id"] for e in found if e["type"] == "response.output_item.added"}
    assert added == {item["id"] for item in final["output"]}
    deltas = "".join(e["delta"] for e in found if e["type"] == "response.output_text.delta")
    assert deltas == "Hello"
    assert events.end() == ""


def test_an_error_after_the_stream_began_is_response_failed_and_the_end() -> None:
    events = ResponseEvents(REQUEST, ToolNames())
    failed = 'data: {"error": {"message": "no link could finish", "code": "backend_failed"}}\n\n'
    found = parsed_events(events.feed(chunk({"content": "Hi"}) + failed + chunk({"content": "x"})))
    kinds = [e["type"] for e in found]
    assert kinds[-1] == "response.failed"
    assert "response.output_item.done" in kinds  # the text so far, closed
    failure = found[-1]["response"]
    assert failure["status"] == "failed"
    assert failure["error"] == {"code": "backend_failed", "message": "no link could finish"}
    assert events.end() == ""


def test_a_stream_cut_by_max_output_tokens_ends_incomplete() -> None:
    events = ResponseEvents(REQUEST, ToolNames())
    found = parsed_events(events.feed(chunk({"content": "Hi"}, "length") + USAGE) + events.end())
    assert found[-1]["type"] == "response.incomplete"
    assert found[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_namespaces_function_is_called_by_its_name_and_comes_back_with_its_namespace() -> None:
    body = codex_request()
    translated = to_chat(body)
    assert translated.names.item_name("close_agent") == ("close_agent", "multi_agent_v1")
    assert translated.names.item_name("exec_command") == ("exec_command", None)
    completion = {
        "id": "chatcmpl-n1",
        "choices": [
            {
                "message": {"tool_calls": [{"id": "c", "function": CLOSE_AGENT}]},
                "finish_reason": "tool_calls",
            }
        ],
    }
    [item] = to_response(completion, body, translated.names)["output"]
    assert (item["type"], item["name"], item["namespace"]) == (
        "function_call",
        "close_agent",
        "multi_agent_v1",
    )
    # Sent back, the call names the chat's function again.
    back = {**body, "input": [*body["input"], {**item, "type": "function_call"}]}
    [*_, last] = to_chat(back).chat["messages"]
    assert last["tool_calls"][0]["function"]["name"] == "close_agent"


def test_a_name_two_tools_share_is_qualified_by_its_namespace() -> None:
    tools = [
        {"type": "function", "name": "run", "parameters": {"type": "object"}},
        {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "run"}]},
    ]
    translated = to_chat({"model": "m", "input": "hi", "tools": tools})
    assert [t["function"]["name"] for t in translated.chat["tools"]] == ["run", "ns__run"]
    assert translated.names.item_name("ns__run") == ("run", "ns")
    assert translated.names.chat_name("run", "ns") == "ns__run"


CLOSE_AGENT = {"name": "close_agent", "arguments": '{"target": "a"}'}


def test_an_answer_that_reasons_again_after_it_spoke_keeps_every_item_its_own_id() -> None:
    events = ResponseEvents(REQUEST, ToolNames())
    chat = "".join(
        chunk(delta) for delta in ({"reasoning": "a"}, {"content": "b"}, {"reasoning": "c"})
    )
    chat += chunk({"content": "d"}, "stop") + USAGE + "data: [DONE]\n\n"
    found = parsed_events(events.feed(chat) + events.end())
    state: ResponseStreamState[object] = ResponseStreamState(input_tools=omit, text_format=omit)
    for data in found:  # raises on two items of one id at different indexes
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=data))  # type: ignore[arg-type]
    ids = [item["id"] for item in found[-1]["response"]["output"]]
    assert len(ids) == len(set(ids)) == 4


def test_a_comment_the_router_sends_while_an_answer_waits_passes_through() -> None:
    events = ResponseEvents(REQUEST, ToolNames())
    out = events.feed(chunk({"content": "Hi"}) + ": gps-waiting\n\n")
    assert out.endswith(": gps-waiting\n\n")


@pytest.mark.parametrize("name", [[], {}, 3])
def test_a_tool_choice_whose_name_is_not_a_string_is_a_400(name: Any) -> None:
    body = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}],
            "tool_choice": {"type": "function", "name": name}}  # fmt: skip
    with pytest.raises(ApiError) as raised:
        to_chat(body)
    assert raised.value.status == 400
