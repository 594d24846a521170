"""A chat-completions stream as the events of a Responses API stream.

Fed the chat stream's SSE text as it comes (any cut between events), it gives the events in the
order OpenAI's SDK expects, each with its `sequence_number`: `response.created`,
`response.in_progress`; for each output item `response.output_item.added`, its deltas and
`response.output_item.done` (a message also its `content_part.added`/`.done` and
`output_text.done`; reasoning its `reasoning_text.delta`/`.done`; a function call its
`function_call_arguments.delta`/`.done`; a custom tool's call one
`custom_tool_call_input.delta` with its raw text and `.done`, once its arguments are whole);
then `response.completed`, or `response.incomplete` (`max_output_tokens` cut it) with the
same output and usage. An error the chat stream carries after it began (no link could finish
it) is `response.failed`, and the stream ends there. Item ids are the same in the events and
in the final response; an answer a failover continued on another link stays one response.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deployments.ingress.responses.answer import (
    call_item,
    custom_input,
    envelope,
    message_item,
    reasoning_item,
    response_id,
    usage,
)
from deployments.ingress.responses.request import ToolNames
from deployments.ingress.translated import ChatStreamTranslator, json_text

__all__ = ["ResponseEvents"]

Body = dict[str, Any]


@dataclass
class _Open:
    """The output item being streamed."""

    kind: str  # reasoning, message, call
    index: int  # its output_index
    item_id: str
    tool: int = 0  # the chat stream's tool-call index
    text: str = ""
    call_id: str = ""
    name: str = ""
    number: int = 0  # a call's, among the response's calls (its item id)


class ResponseEvents(ChatStreamTranslator):
    """One response's events from one chat stream's text (`feed`, then `end`)."""

    def __init__(self, request: Mapping[str, Any], names: ToolNames, rid: str = "") -> None:
        """`rid`: the response's id (the ingress makes one); else the completion's."""
        super().__init__()
        self._request = request
        self._names = names
        self._sequence = 0
        self._rid = rid
        self._created = 0
        self._output: list[Body] = []
        self._open: _Open | None = None
        self._calls = 0
        self._finish: Any = None
        self._usage: Any = None
        self._started = False
        self.final: Body | None = None  # the completed (or incomplete) response, once over

    def _closing(self) -> str:
        out = self._start({}) + self._close()
        cut = self._finish == "length"
        response = self._response("incomplete" if cut else "completed")
        response["output"] = list(self._output)
        response["usage"] = usage(self._usage)
        if cut:
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        kind = "response.incomplete" if cut else "response.completed"
        self.final = response
        return out + self._event(kind, {"response": response})

    def _keep_alive(self, comment: str) -> str:
        return comment + "\n\n"  # SDKs skip a comment; it keeps the connection alive

    def _response(self, status: str) -> Body:
        return envelope(self._request, self._rid, self._created, status)

    def _event(self, kind: str, data: Body) -> str:
        body = {"type": kind, **data, "sequence_number": self._sequence}
        self._sequence += 1
        return f"event: {kind}\ndata: {json_text(body)}\n\n"

    def _start(self, chunk: Mapping[str, Any]) -> str:
        if self._started:
            return ""
        self._started = True
        self._rid = self._rid or response_id(chunk.get("id"))
        self._created = int(chunk.get("created") or 0)
        started = self._response("in_progress")
        return self._event("response.created", {"response": started}) + self._event(
            "response.in_progress", {"response": started}
        )

    def _chunk(self, chunk: Mapping[str, Any]) -> str:
        out = self._start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                out += self._text("reasoning", reasoning)
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._text("message", text)
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
        return out

    def _text(self, kind: str, text: str) -> str:
        out = ""
        if self._open is None or self._open.kind != kind:
            out += self._close()
            out += self._add(kind)
        assert self._open is not None
        self._open.text += text
        where = {"item_id": self._open.item_id, "output_index": self._open.index}
        if kind == "message":
            delta = {**where, "content_index": 0, "delta": text, "logprobs": []}
            return out + self._event("response.output_text.delta", delta)
        delta = {**where, "content_index": 0, "delta": text}
        return out + self._event("response.reasoning_text.delta", delta)

    def _add(self, kind: str) -> str:
        index = len(self._output)
        if kind == "message":
            item = message_item(self._rid, index, "", "in_progress")
            item["content"] = []
        else:
            item = {**reasoning_item(self._rid, index, ""), "content": [], "status": "in_progress"}
        self._open = _Open(kind, index, item["id"])
        out = self._event("response.output_item.added", {"output_index": index, "item": item})
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out += self._event("response.content_part.added", {**where, "part": part})
        return out

    def _call(self, call: Mapping[str, Any]) -> str:
        tool = int(call.get("index") or 0)
        function = call.get("function") or {}
        out = ""
        if self._open is None or self._open.kind != "call" or self._open.tool != tool:
            out += self._close()
            name = str(function.get("name") or "")
            call_id = str(call.get("id") or f"call_{tool}")
            number = self._calls
            item = call_item(self._rid, number, call_id, name, "", self._names)
            self._calls += 1
            index = len(self._output)
            self._open = _Open("call", index, item["id"], tool, "", call_id, name, number)
            added = {**item, "status": "in_progress"}
            out += self._event("response.output_item.added", {"output_index": index, "item": added})
        assert self._open is not None
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._open.text += arguments
            if self._open.name not in self._names.custom:  # a custom tool's input goes whole
                where = {"item_id": self._open.item_id, "output_index": self._open.index}
                out += self._event(
                    "response.function_call_arguments.delta", {**where, "delta": arguments}
                )
        return out

    def _close(self) -> str:
        item = self._open
        if item is None:
            return ""
        self._open = None
        where = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == "message":
            done = message_item(self._rid, item.index, item.text)
            part = done["content"][0]
            out = self._event(
                "response.output_text.done",
                {**where, "content_index": 0, "text": item.text, "logprobs": []},
            )
            out += self._event(
                "response.content_part.done", {**where, "content_index": 0, "part": part}
            )
        elif item.kind == "reasoning":
            done = reasoning_item(self._rid, item.index, item.text)
            out = self._event(
                "response.reasoning_text.done", {**where, "content_index": 0, "text": item.text}
            )
        else:
            done = call_item(
                self._rid, item.number, item.call_id, item.name, item.text, self._names
            )
            if item.name in self._names.custom:
                raw = custom_input(item.text)
                out = self._event("response.custom_tool_call_input.delta", {**where, "delta": raw})
                out += self._event("response.custom_tool_call_input.done", {**where, "input": raw})
            else:
                out = self._event(
                    "response.function_call_arguments.done",
                    {**where, "name": done["name"], "arguments": item.text},
                )
        self._output.append(done)
        return out + self._event(
            "response.output_item.done", {"output_index": item.index, "item": done}
        )

    def _failed(self, error: Any) -> str:
        info = error if isinstance(error, dict) else {}
        code = info.get("code")
        failure = {
            "code": code if isinstance(code, str) else "server_error",
            "message": str(info.get("message") or "The response failed."),
        }
        out = self._start({}) + self._close()
        response = self._response("failed")
        response["output"] = list(self._output)
        response["error"] = failure
        response["usage"] = usage(self._usage)
        return out + self._event("response.failed", {"response": response})
