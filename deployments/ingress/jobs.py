"""A request's job: the model it goes to (by name, alias or role; for `auto` the depth router's
choice), its priority class, and its body as the gateway's own request type (core/requests.py),
checked against vLLM's own schema as well as ours, every mistake in it a 400 (or 403, 404) with
OpenAI error JSON. The same for HTTP requests and batch lines
(deployments/ingress/app.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from core.config import ClusterConfig, GatewayConfig
from core.errors import ApiError, ErrorCode, invalid_fields
from core.requests import ChatRequest, CompletionRequest, EmbeddingRequest
from core.types import AUTO_MODEL, Depth, Role
from core.wire import ChatJob
from deployments.ingress.auth import Caller, claimed_priority
from policy.context.tokens import message_text
from policy.depth import DepthDecision, UnknownDepth, classify
from policy.model_access import by_pattern, may_use, usable_names
from policy.request import (
    check_chat_request,
    check_completion_request,
    check_embedding_request,
    check_tool_support,
)
from policy.request.engine_schema import check_engine_schema
from policy.request.images import check_images
from policy.request.messages import carries_images

__all__ = ["SESSION_HEADER", "Jobs", "validate_chat", "with_session"]

SESSION_HEADER = "x-session-id"
MAX_SESSION_CHARS = 256


def with_session(job: ChatJob, header: str | None) -> ChatJob:
    """The job with its `X-Session-Id` as the request's `user` (OpenAI's end-user id, which
    vLLM only logs): the session the backend's replicas are chosen by. Without the header the
    body's own `user`, if any, is the session."""
    if header is None:
        return job
    if not 0 < len(header) <= MAX_SESSION_CHARS or not header.isprintable():
        raise ApiError(
            400,
            ErrorCode.INVALID_REQUEST,
            f"X-Session-Id must be 1 to {MAX_SESSION_CHARS} printable characters.",
            param="X-Session-Id",
        )
    return replace(job, request=job.request.changed(user=header))


class Jobs:
    """Jobs from parsed bodies: `chat`, `completion` and `embedding` each take the body, the
    caller, its X-Priority and X-Depth headers, and give the job and the depth decided."""

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config
        self._served = config.served_names

    def chat(
        self,
        payload: dict[str, Any],
        caller: Caller,
        priority: str | None,
        depth_header: str | None,
    ) -> tuple[ChatJob, DepthDecision | None]:
        limits = self._config.gateway
        model = self._model_for(payload, caller)
        claimed = claimed_priority(priority, caller)
        chat_request = validate_chat(payload, limits)
        depth = None
        context_share = 1.0
        if carries_images(chat_request.messages):  # before the depth router: only a reader will do
            model = self._reader_of_images(model, caller)
        elif model is None:  # `model: auto`: the depth router picks the model and the budget
            effort = payload.get("reasoning_effort")
            depth = self._depth_for(
                _latest_user_text(payload),
                depth_header,
                effort if isinstance(effort, str) else None,
            )
            model, context_share = self._config.depth_route(depth.depth)
            _check_allowed(caller, model, model)  # `auto` was allowed; its choice must be too
        check_tool_support(payload, payload["model"], self._config.base_model(model).tools)
        return ChatJob(chat_request, model, claimed, caller.name, context_share), depth

    def completion(
        self,
        payload: dict[str, Any],
        caller: Caller,
        priority: str | None,
        depth_header: str | None,
    ) -> tuple[ChatJob, DepthDecision | None]:
        model = self._model_for(payload, caller)
        claimed = claimed_priority(priority, caller)
        completion = _validate_completion(payload)
        depth = None
        context_share = 1.0
        if model is None:  # `model: auto`: the depth of the prompt's text picks the model
            text = completion.prompt if isinstance(completion.prompt, str) else ""
            depth = self._depth_for(text, depth_header)
            model, context_share = self._config.depth_route(depth.depth)
            _check_allowed(caller, model, model)  # `auto` was allowed; its choice must be too
        return ChatJob(completion, model, claimed, caller.name, context_share), depth

    def embedding(
        self, payload: dict[str, Any], caller: Caller, priority: str | None, _: str | None
    ) -> tuple[ChatJob, DepthDecision | None]:
        model = self._model_for(payload, caller, vectors=True)
        claimed = claimed_priority(priority, caller)
        assert model is not None  # `auto` chooses among text models: refused for vectors
        return ChatJob(_validate_embedding(payload), model, claimed, caller.name), None

    def counted_model(self, payload: dict[str, Any], caller: Caller) -> str:
        """The model whose tokenizer counts a request's prompt (`auto`: the balanced depth's
        model, the one a request with no other sign goes to)."""
        model = self._model_for(payload, caller)
        if carries_images(payload.get("messages")):  # counted where they would be read
            model = self._reader_of_images(model, caller)
        elif model is None:
            model = self._config.depth_route(Depth.BALANCED)[0]
            _check_allowed(caller, model, model)
        return self._config.base_model(model).name

    def _model_for(
        self, payload: dict[str, Any], caller: Caller, vectors: bool = False
    ) -> str | None:
        """The model a request names (by name, alias or role); None for `auto`, which the
        depth router resolves. `vectors`: for `/v1/embeddings`, which only an embedding model
        answers (and text endpoints never go to one)."""
        name = payload.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(
                400, ErrorCode.MISSING_MODEL, "The field 'model' is required.", param="model"
            )
        asked = name
        if name not in self._served:  # a vendor's name an agent sends (gateway.model_patterns)
            name = by_pattern(name, self._config.gateway.model_patterns) or name
        _check_allowed(caller, asked, self._served.get(name))
        if name not in self._served:
            available = ", ".join(usable_names(caller.models, self._served))
            raise ApiError(
                404,
                ErrorCode.MODEL_NOT_FOUND,
                f"The model {name!r} does not exist. Available models: {available}.",
                param="model",
            )
        model = self._served[name]
        _check_kind(name, model, vectors, self._config)
        return model

    def _reader_of_images(self, model: str | None, caller: Caller) -> str:
        """A request with images goes to the model asked where it reads them, else (`auto`
        too) to the vision role's model: a text model cannot read them, and none is dropped
        unread."""
        if model is not None and self._config.reads_images(self._config.base_model(model)):
            return model
        vision = self._served.get(Role.VISION.value)
        if vision is None or not self._config.reads_images(self._config.base_model(vision)):
            asked = AUTO_MODEL if model is None else model
            raise ApiError(
                400,
                ErrorCode.INVALID_REQUEST,
                f"The model {asked!r} cannot read images, and no model here reads them: send "
                "text only, or serve a vision-language model as role vision.",
                param="messages",
            )
        _check_allowed(caller, vision, vision)
        return vision

    def _depth_for(
        self, latest: str, header: str | None, effort: str | None = None
    ) -> DepthDecision:
        try:
            return classify(
                latest, rules=self._config.depth, header=header, reasoning_effort=effort
            )
        except UnknownDepth as error:
            raise ApiError(400, ErrorCode.INVALID_REQUEST, str(error), param="X-Depth") from None


def validate_chat(payload: dict[str, Any], limits: GatewayConfig) -> ChatRequest:
    """The request as our ChatRequest, or ApiError 400: never another exception."""
    check_chat_request(payload, max_messages=limits.max_messages)
    check_images(payload["messages"], limits.media)
    return _as_request(ChatRequest, payload, "chat")


def _latest_user_text(payload: dict[str, Any]) -> str:
    messages = payload["messages"]  # validated: a non-empty list of messages
    users = [m for m in messages if m.get("role") == "user"]
    return message_text(users[-1]) if users else ""


def _check_allowed(caller: Caller, requested: str, model: str | None) -> None:
    """403 for a model the caller's key may not use: the same answer whether or not it exists."""
    if not may_use(caller.models, requested, model):
        raise ApiError(
            403,
            ErrorCode.MODEL_NOT_ALLOWED,
            f"This API key may not use the model {requested!r}.",
            param="model",
        )


def _check_kind(name: str, model: str | None, vectors: bool, config: ClusterConfig) -> None:
    """Text endpoints never reach an embedding model, nor `/v1/embeddings` a text model (`auto`,
    None here, resolves to a text model)."""
    generates = model is None or config.base_model(model).generates
    if vectors and generates:
        names = ", ".join(m.name for m in config.models if not m.generates)
        where = f"embedding models here: {names}" if names else "no embedding model is served"
        message = f"The model {name!r} generates text, not embeddings ({where})."
        raise ApiError(400, ErrorCode.INVALID_REQUEST, message, param="model")
    if not vectors and not generates:
        message = f"The model {name!r} is an embedding model: send it to /v1/embeddings."
        raise ApiError(400, ErrorCode.INVALID_REQUEST, message, param="model")


def _validate_embedding(payload: dict[str, Any]) -> EmbeddingRequest:
    """The request as our EmbeddingRequest, or ApiError 400."""
    check_embedding_request(payload)
    return _as_request(EmbeddingRequest, payload, "embedding")


def _validate_completion(payload: dict[str, Any]) -> CompletionRequest:
    """The request as our CompletionRequest, or ApiError 400: never another exception."""
    check_completion_request(payload)
    return _as_request(CompletionRequest, payload, "completion")


Kind = TypeVar("Kind", bound=BaseModel)


def _as_request(model: type[Kind], payload: dict[str, Any], kind: str) -> Kind:
    """The body checked against vLLM's schema (which its replica applies again: what the edge
    lets through, the engine must not refuse after admission), then read as our type."""
    check_engine_schema(kind, payload)
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        raise invalid_fields(error) from None
