"""Which models a key may use (`api_keys[].models`: names or globs, fnmatch-style).

A key may use a name it asks for when a pattern matches that name, or the model the name
reaches (an alias or a role's name reaches a model). A name outside the key's patterns is
refused the same way whether or not it exists, so a limited key cannot probe the catalog.

Pure: patterns and names in, answers out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

__all__ = ["by_pattern", "matches_any", "may_use", "usable_names"]


def matches_any(patterns: Iterable[str], name: str) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def may_use(patterns: tuple[str, ...] | None, requested: str, model: str | None) -> bool:
    """`patterns` None: every model. `model`: what `requested` reaches (None: not known yet,
    as for `auto` before the depth router chooses, or a name that does not exist)."""
    if patterns is None:
        return True
    return matches_any(patterns, requested) or (model is not None and matches_any(patterns, model))


def usable_names(patterns: tuple[str, ...] | None, served: Mapping[str, str | None]) -> list[str]:
    """The served names (name -> the model it reaches) a key may use, in catalog order."""
    return [name for name, model in served.items() if may_use(patterns, name, model)]


def by_pattern(name: str, patterns: Mapping[str, str]) -> str | None:
    """The name the first pattern (in order) matching `name` reaches (`gateway.model_patterns`),
    or None."""
    return next((to for pattern, to in patterns.items() if fnmatchcase(name, pattern)), None)
