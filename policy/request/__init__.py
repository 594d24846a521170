"""A client's request, read and checked before it reaches the router: every mistake is a 400
(or 413) with OpenAI error JSON naming the field, never an exception in the ingress and never
work for an engine."""

from policy.request.body import nesting_exceeds, parse_object
from policy.request.completion import check_completion_request
from policy.request.embedding import check_embedding_request, embedding_inputs
from policy.request.schema import check_chat_request
from policy.request.tools import check_tool_support

__all__ = [
    "check_chat_request",
    "check_completion_request",
    "check_embedding_request",
    "check_tool_support",
    "embedding_inputs",
    "nesting_exceeds",
    "parse_object",
]
