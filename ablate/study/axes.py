"""Axes and config paths: the names a study may vary (``seed``, ``fp4_gemms``, ``train.lr``...), how
a dotted path reads and writes a config dict, and how a value is written in labels and tags."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ablate.study.messages import did_you_mean, short_key
from ablate.study.schema import SECTIONS, TOP_AXES


def check_axis_name(name: str) -> str | None:
    allowed = [*TOP_AXES, *(f"{s}.<field>" for s in SECTIONS)]
    if "." not in name:
        if name in TOP_AXES:
            return None
        if name in SECTIONS:
            return (
                f"{name!r} is a section; vary one of its fields (e.g. {name}.{_first_field(name)})"
            )
        hint = did_you_mean(name, [*TOP_AXES, *_all_dotted()])
        return f"unknown axis {short_key(name)!r}{hint}; allowed: {', '.join(allowed)}"
    section, _, fname = name.partition(".")
    if section not in SECTIONS:
        hint = did_you_mean(name, _all_dotted())
        return f"unknown axis {short_key(name)!r}{hint}; allowed: {', '.join(allowed)}"
    names = section_fields(section)
    if fname not in names:
        hint = did_you_mean(fname, names)
        return f"{section} has no field {short_key(fname)!r}{hint}; allowed: {', '.join(names)}"
    return None


def section_fields(section: str) -> list[str]:
    """The field names of a section: a config dataclass's (``train``) or a pydantic model's
    (``warmup``)."""
    t = SECTIONS[section]
    if dataclasses.is_dataclass(t):
        return [f.name for f in dataclasses.fields(t)]
    return list(t.model_fields)  # type: ignore[attr-defined]


def _first_field(section: str) -> str:
    return section_fields(section)[0]


def _all_dotted() -> list[str]:
    return [f"{s}.{f}" for s in SECTIONS for f in section_fields(s)]


def with_values(base: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with dotted-path overrides."""
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for name, v in values.items():
        if "." in name:
            section, _, fname = name.partition(".")
            if d.get(section) is None:  # a section the base leaves out (warmup: None)
                d[section] = {}
            d[section][fname] = v
        else:
            d[name] = v
    return d


def get_path(d: Mapping[str, Any], name: str) -> Any:
    if "." in name:
        section, _, fname = name.partition(".")
        return d[section][fname]
    return d[name]


def fmt_value(v: Any, limit: int = 1000) -> str:
    """A value as labels, tags and error messages write it (``[fprop,dgrad]``, ``0.003``), at most
    ``limit`` characters: a longer one ends in ``...``, and a huge value (a YAML alias bomb) is
    never walked past the limit."""
    out: list[str] = []
    room = [limit]

    def put(text: str) -> bool:
        out.append(text[: max(0, room[0])])
        room[0] -= len(text)
        return room[0] >= 0

    def walk(x: Any) -> bool:
        if isinstance(x, list):
            if not put("["):
                return False
            for i, item in enumerate(x):
                if (i and not put(",")) or not walk(item):
                    return False
            return put("]")
        if isinstance(x, dict):
            if not put("{"):
                return False
            for i, (k, item) in enumerate(x.items()):
                if (i and not put(", ")) or not put(f"{k}: ") or not walk(item):
                    return False
            return put("}")
        return put(f"{x:g}" if isinstance(x, float) else str(x))

    if walk(v):
        return "".join(out)
    return "".join(out)[: max(0, limit - 3)] + "..."
