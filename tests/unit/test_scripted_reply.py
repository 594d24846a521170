"""The test engine's script (tests/fakes/scripted_reply.py): the coding agents' round trips in
tests/e2e/test_coding_agents.py stand on it, so what it answers is pinned here."""

from __future__ import annotations

import json

from tests.fakes.scripted_reply import QUOTE, ScriptedCall, ScriptedText, scripted_reply

ASK = {"role": "user", "content": 'Read it.\nCALL Read {"file_path": "/w/probe.txt"}'}


def test_a_directive_for_an_offered_tool_is_answered_with_that_call() -> None:
    reply = scripted_reply([{"role": "system", "content": "x"}, ASK], ["Bash", "Read"])
    assert reply == ScriptedCall("Read", json.dumps({"file_path": "/w/probe.txt"}))


def test_a_directive_for_a_tool_not_offered_or_no_directive_leaves_the_engine_its_words() -> None:
    assert scripted_reply([ASK], ["Bash"]) is None
    assert scripted_reply([{"role": "user", "content": "Hi."}], ["Read"]) is None


def test_once_a_tool_answered_its_result_is_quoted_from_text_parts_too() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]}
    reply = scripted_reply([ASK, call, result, {"role": "system", "content": "env"}], ["Read"])
    assert reply == ScriptedText(QUOTE + "42")
