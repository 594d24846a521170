"""Bearer-key authentication and the priority class a caller may claim."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.config import ApiKeyConfig, hash_key
from core.errors import ApiError, ErrorCode
from core.types import PriorityClass

PRIORITY_HEADER = "x-priority"


@dataclass(frozen=True)
class Caller:
    name: str
    priority: PriorityClass
    max_priority: PriorityClass
    admin: bool = False
    models: tuple[str, ...] | None = None  # names or globs it may use; None: every model


class KeyRing:
    """Keys are held only as SHA-256 digests; with none configured, auth is off. The config's
    keys, and with them the run-time keys (/v1/keys) this replica's `KeySync` keeps here:
    until it has read them once (`run_time_pending`), a key not known is refused with a 503
    (it may be a run-time key), not a 401."""

    def __init__(self, keys: Sequence[ApiKeyConfig], default_priority: PriorityClass) -> None:
        self._config = {key.sha256: key for key in keys}
        self._by_digest = dict(self._config)
        self._run_time: tuple[ApiKeyConfig, ...] = ()
        self._anonymous = Caller("anonymous", default_priority, PriorityClass.USER)
        self.run_time_pending = False  # set by the sync that will read them (key_routes.py)

    @property
    def enabled(self) -> bool:
        return bool(self._config)

    @property
    def config_names(self) -> tuple[str, ...]:
        return tuple(key.name for key in self._config.values())

    def use_run_time(self, keys: Sequence[ApiKeyConfig]) -> None:
        """The run-time keys from now on (a config key's name or digest wins; none is admin)."""
        self._run_time = tuple(keys)
        self._merge()
        self.run_time_pending = False

    def use_config(self, keys: Sequence[ApiKeyConfig], default_priority: PriorityClass) -> None:
        """A reload's config keys (never none where there were some, nor some where there
        were none: turning auth on or off takes a restart, core/config/reload.py)."""
        self._config = {key.sha256: key for key in keys}
        self._anonymous = Caller("anonymous", default_priority, PriorityClass.USER)
        self._merge()

    def _merge(self) -> None:
        names = set(self.config_names)
        run_time = {
            key.sha256: key.model_copy(update={"admin": False})
            for key in self._run_time
            if key.name not in names
        }
        self._by_digest = {**run_time, **self._config}

    def authenticate(self, authorization: str | None) -> Caller:
        if not self.enabled:
            return self._anonymous
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                ErrorCode.MISSING_API_KEY,
                "No API key given: send the header 'Authorization: Bearer <key>'.",
                headers={"WWW-Authenticate": "Bearer"},
            )
        key = self._by_digest.get(hash_key(token.strip()))
        if key is None and self.run_time_pending:
            raise ApiError(
                503,
                ErrorCode.KEYS_UNAVAILABLE,
                "The gateway has not read its run-time keys yet; retry in a second.",
                headers={"Retry-After": "1"},
            )
        if key is None:
            raise ApiError(
                401,
                ErrorCode.INVALID_API_KEY,
                "The API key is not valid.",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return _caller(key)

    def named(self, name: str) -> Caller:
        """The caller a batch was created by (its lines run under that key's limits); a key
        removed since is refused, as its requests would be."""
        if not self.enabled:
            return self._anonymous
        for key in self._by_digest.values():
            if key.name == name:
                return _caller(key)
        raise ApiError(401, ErrorCode.INVALID_API_KEY, f"The key {name!r} is no longer configured.")


def _caller(key: ApiKeyConfig) -> Caller:
    return Caller(key.name, key.priority, key.max_priority, key.admin, key.models)


def claimed_priority(header: str | None, caller: Caller) -> PriorityClass:
    """The class from `X-Priority` (or the caller's default), never above the caller's cap."""
    if header is None or not header.strip():
        wanted = caller.priority
    else:
        try:
            wanted = PriorityClass(header.strip().lower())
        except ValueError:
            choices = ", ".join(c.value for c in PriorityClass)
            raise ApiError(
                400,
                ErrorCode.INVALID_PRIORITY,
                f"X-Priority must be one of: {choices}.",
                param="X-Priority",
            ) from None
    return wanted if wanted.rank >= caller.max_priority.rank else caller.max_priority
