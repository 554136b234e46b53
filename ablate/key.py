"""A cell's key: the hash of everything that changes a run's numbers, built from what each config
field declares about itself.

Every field of the configs a run is made of (``RunConfig`` and the configs it holds:
``TrainConfig``, ``ModelConfig``, ``DataConfig``, ``ValData``) declares in its metadata how it
enters the key, with one of:

    ALWAYS             in the key, as its value (a nested config by its own fields' rules)
    unless_default()   left out where its value is the field's default (``neutral=`` another
                       value, ``omit=`` a test on the config that holds it)
    NEVER              never: it changes no number (where checkpoints go, how often to log)

A rule may ``resolve`` the value the key holds (``train.precision`` as the precision it means on
the cell's device kind, ``model.hf`` as its config's contents) or hold it under another ``name``
(``device`` as ``device_kind``). A field added with ``unless_default()`` leaves the key of every
recorded cell unchanged; ``tests/ablate/test_key.py`` fails for a config field without a rule.

The recipe enters the key as its canonical serialisation (``Recipe.to_dict``), whose operand options
declare their rule in ``backends`` as the strings ``"always"`` and ``"unless_default"`` (``backends``
imports nothing of ``ablate``); ``rule_of`` reads those too. This module imports nothing of the
project, so that every config's module can declare its fields' rules.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

META = "key"
"""The metadata entry of a field's ``KeyRule``."""
_DEFAULT = object()


@dataclass(frozen=True, slots=True)
class KeyRule:
    """How one config field enters a cell's key (see the module docstring)."""

    never: bool = False
    resolve: Callable[[Any, Any, str], Any] | None = None
    """``(value, holder, device_kind) -> the value the key holds``; None: the field's value."""
    neutral: Any = None
    """With ``optional``: the resolved value at which the field is left out (``_DEFAULT``: the
    field's default, resolved)."""
    optional: bool = False
    omit: Callable[[Any, str], bool] | None = None
    """``(holder, device_kind) -> left out``: a test on the config that holds the field."""
    name: str | None = None
    """The key's name for the field (None: the field's own)."""

    def metadata(self) -> dict[str, KeyRule]:
        return {META: self}


ALWAYS = KeyRule()
NEVER = KeyRule(never=True)


def always(
    *,
    resolve: Callable[[Any, Any, str], Any] | None = None,
    name: str | None = None,
    omit: Callable[[Any, str], bool] | None = None,
) -> dict[str, KeyRule]:
    """Field metadata: in the key (resolved by ``resolve``, under ``name``), except where
    ``omit(holder, device_kind)`` says the field means nothing (``train.workers`` in one process)."""
    return KeyRule(resolve=resolve, name=name, omit=omit).metadata()


def never() -> dict[str, KeyRule]:
    """Field metadata: never in the key."""
    return NEVER.metadata()


def unless_default(
    *,
    neutral: Any = _DEFAULT,
    resolve: Callable[[Any, Any, str], Any] | None = None,
    omit: Callable[[Any, str], bool] | None = None,
) -> dict[str, KeyRule]:
    """Field metadata: left out where its (resolved) value is ``neutral`` (default: the field's
    default, resolved the same way), or where ``omit(holder, device_kind)`` says so."""
    return KeyRule(resolve=resolve, neutral=neutral, optional=True, omit=omit).metadata()


_NAMED = {
    "always": ALWAYS,
    "never": NEVER,
    "unless_default": KeyRule(optional=True, neutral=_DEFAULT),
}


def rule_of(f: dataclasses.Field[Any]) -> KeyRule | None:
    """The key rule a config field declares (a ``KeyRule``, or its name), or None."""
    rule = f.metadata.get(META)
    if isinstance(rule, str):
        return _NAMED.get(rule)
    return rule if isinstance(rule, KeyRule) else None


def _plain(v: Any) -> Any:
    """A resolved value as JSON holds it: enums by value, tuples as lists."""
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


def key_fields(obj: Any, kind: str) -> dict[str, Any]:
    """The fields of config dataclass ``obj`` that enter the key, by their rules, nested configs
    recursed into; ``kind`` is the device kind (cpu, cuda) the run trains on. Raises TypeError
    naming a field that declares no rule."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        rule = rule_of(f)
        if rule is None:
            raise TypeError(
                f"{type(obj).__name__}.{f.name} declares no key rule: give its field "
                "metadata=always(), unless_default() or never() (ablate.key)"
            )
        if rule.never:
            continue
        if rule.omit is not None and rule.omit(obj, kind):
            continue
        v = getattr(obj, f.name)
        value = _resolved(rule, v, obj, kind)
        if rule.optional:
            neutral = rule.neutral
            if neutral is _DEFAULT:
                neutral = _resolved(rule, _default(f), obj, kind)
            if value == neutral:
                continue
        out[rule.name or f.name] = value
    return out


def _resolved(rule: KeyRule, v: Any, holder: Any, kind: str) -> Any:
    if rule.resolve is not None:
        return _plain(rule.resolve(v, holder, kind))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return key_fields(v, kind)
    return _plain(v)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"{f.name}: unless_default() needs a default or neutral=")


def digest(d: Mapping[str, Any]) -> str:
    """16 hex digits of the sha256 of ``d`` as JSON with sorted keys."""
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


__all__ = [
    "ALWAYS",
    "NEVER",
    "KeyRule",
    "always",
    "digest",
    "key_fields",
    "never",
    "unless_default",
]
