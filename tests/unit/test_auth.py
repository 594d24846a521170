"""Unit tests for deployments/ingress/auth.py (keys, priority claims) and core/errors.py."""

from __future__ import annotations

import pytest

from core.config import ApiKeyConfig, hash_key
from core.errors import ApiError
from core.types import PriorityClass
from deployments.ingress.auth import Caller, KeyRing, claimed_priority
from deployments.ingress.error_response import error_response

USER, AGENT, BACKGROUND = PriorityClass.USER, PriorityClass.AGENT, PriorityClass.BACKGROUND


def ring(default: PriorityClass = USER) -> KeyRing:
    keys = [
        ApiKeyConfig(name="alice", sha256=hash_key("alice-key")),
        ApiKeyConfig(
            name="batch", sha256=hash_key("batch-key"), priority=BACKGROUND, max_priority=AGENT
        ),
    ]
    return KeyRing(keys, default)


def auth_error(keys: KeyRing, authorization: str | None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        keys.authenticate(authorization)
    return caught.value


# --- ApiError -----------------------------------------------------------------------------------


def test_error_body_has_the_openai_shape() -> None:
    error = ApiError(400, "invalid_priority", "Bad X-Priority.", param="X-Priority")
    assert error.body() == {
        "error": {
            "message": "Bad X-Priority.",
            "type": "invalid_request_error",
            "code": "invalid_priority",
            "param": "X-Priority",
        }
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (429, "rate_limit_error"),
        (503, "service_unavailable_error"),
    ],
)
def test_error_type_follows_the_status(status: int, kind: str) -> None:
    body = ApiError(status, "some_code", "Some message.").body()
    assert body["error"]["type"] == kind
    assert body["error"]["param"] is None


def test_error_response_carries_status_headers_and_body() -> None:
    error = ApiError(401, "missing_api_key", "No key.", headers={"WWW-Authenticate": "Bearer"})
    response = error_response(error)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert b'"code":"missing_api_key"' in response.body


# --- KeyRing ------------------------------------------------------------------------------------


def test_no_keys_means_auth_off_and_an_anonymous_caller() -> None:
    keys = KeyRing([], AGENT)
    assert not keys.enabled
    caller = keys.authenticate(None)
    assert caller.name == "anonymous"
    assert caller.priority == AGENT


def test_no_keys_accepts_any_header() -> None:
    assert KeyRing([], USER).authenticate("Bearer whatever").name == "anonymous"


def test_configured_keys_turn_auth_on() -> None:
    assert ring().enabled


def test_missing_header_is_401_missing_api_key() -> None:
    error = auth_error(ring(), None)
    assert error.status == 401
    assert error.code == "missing_api_key"
    assert error.headers == {"WWW-Authenticate": "Bearer"}
    assert "Authorization: Bearer" in error.message


@pytest.mark.parametrize("header", ["Basic YWxpY2U6a2V5", "alice-key", "Bearer ", "Bearer", ""])
def test_wrong_scheme_or_empty_token_is_missing_api_key(header: str) -> None:
    error = auth_error(ring(), header)
    assert (error.status, error.code) == (401, "missing_api_key")


def test_wrong_key_is_401_invalid_api_key() -> None:
    error = auth_error(ring(), "Bearer not-a-key")
    assert error.status == 401
    assert error.code == "invalid_api_key"
    assert error.headers == {"WWW-Authenticate": "Bearer"}
    assert error.body()["error"]["type"] == "authentication_error"


def test_error_never_echoes_the_key() -> None:
    error = auth_error(ring(), "Bearer sk-leaked-secret")
    assert "sk-leaked-secret" not in str(error.body())


def test_right_key_gives_the_callers_name_and_priority() -> None:
    caller = ring().authenticate("Bearer batch-key")
    assert caller == Caller("batch", BACKGROUND, AGENT)


def test_scheme_is_case_insensitive_and_token_is_trimmed() -> None:
    assert ring().authenticate("bearer  alice-key ").name == "alice"


def test_key_text_is_case_sensitive() -> None:
    assert auth_error(ring(), "Bearer ALICE-KEY").code == "invalid_api_key"


# --- claimed_priority ---------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "", "  "])
def test_no_header_gives_the_keys_default(header: str | None) -> None:
    assert claimed_priority(header, Caller("batch", BACKGROUND, AGENT)) == BACKGROUND


def test_claim_above_the_cap_is_lowered_to_the_cap() -> None:
    assert claimed_priority("user", Caller("batch", BACKGROUND, AGENT)) == AGENT


def test_claim_at_the_cap_is_honoured() -> None:
    assert claimed_priority("agent", Caller("batch", BACKGROUND, AGENT)) == AGENT


def test_lower_claim_is_honoured() -> None:
    assert claimed_priority("background", Caller("alice", USER, USER)) == BACKGROUND


def test_claim_is_case_insensitive() -> None:
    assert claimed_priority(" Background ", Caller("alice", USER, USER)) == BACKGROUND


def test_default_above_the_cap_is_lowered_too() -> None:
    assert claimed_priority(None, Caller("odd", USER, BACKGROUND)) == BACKGROUND


@pytest.mark.parametrize("header", ["urgent", "0", "users"])
def test_invalid_claim_is_400_invalid_priority(header: str) -> None:
    with pytest.raises(ApiError) as caught:
        claimed_priority(header, Caller("alice", USER, USER))
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "invalid_priority", "X-Priority")
    assert "user, agent, background" in error.message
    assert error.body()["error"]["type"] == "invalid_request_error"
