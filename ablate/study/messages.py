"""Error messages of the study: pydantic's errors translated into ``StudyError`` lines (one per
problem, each starting with its YAML path, a key longer than 60 characters cut: ``short_key``):
unknown keys with the allowed ones and a did-you-mean, the trainer's own ``field: message`` texts
placed at their path; booleans written where numbers are expected, which pydantic's lax mode would
read as 1 or 0."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


def short_key(key: Any, limit: int = 60) -> str:
    """A key as an error message names it: at most ``limit`` characters, a longer one cut with
    ``...`` (a study can hold a key of thousands of characters)."""
    text = str(key)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_SCALAR_TAGS = ("str", "int", "float", "bool", "none", "json-or-python[json=float,python=float]")


def _union_tag(root: type, loc: Sequence[Any], i: int) -> bool:
    """Whether ``loc[i]`` names a member of a union (pydantic's ``str``, ``literal['auto']``,
    ``RecipeOverride``...) rather than a key of the study."""
    x = loc[i]
    if i == 0 or not isinstance(x, str) or x in _allowed_keys(root, loc[:i]):
        return False
    return (
        x in _SCALAR_TAGS
        or x.startswith(("literal[", "list[", "dict[", "tuple["))
        or x[:1].isupper()
    )


def pydantic_errors(e: ValidationError, root: type) -> list[str]:
    out = []
    unions: dict[str, tuple[list[str], Any]] = {}  # a path -> the messages of its union's members
    for err in e.errors():
        loc = [x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-"))]
        tagged = [i for i in range(len(loc)) if _union_tag(root, loc, i)]
        if tagged and err["type"] not in ("extra_forbidden", "missing", "value_error"):
            path = _yaml_path([x for i, x in enumerate(loc) if i not in tagged])
            msgs, _ = unions.setdefault(path, ([], err.get("input")))
            if err["msg"] not in msgs:
                msgs.append(err["msg"])
                out.append(path)  # placeholder, filled below
            continue
        loc = [x for i, x in enumerate(loc) if i not in tagged]
        where = _yaml_path(loc)
        msg = err["msg"]
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            allowed = _allowed_keys(root, loc[:-1])
            hint = did_you_mean(str(loc[-1]), allowed) if allowed else ""
            msg = f"unknown key{hint}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            # the trainer's messages start with their own dotted path (train.grad_accum: ...), a
            # model's cross-field checks with the key they blame (recipe: ...)
            head, sep, rest = msg.partition(": ")
            field = head.split(".")[0].split("[")[0]
            if sep and " " not in head and ("." in head or field in _allowed_keys(root, loc)):
                parent = list(loc)
                parts = head.split(".")
                # the message's path repeats the end of the location (data.val: ... at data.val)
                k = max(
                    (
                        n
                        for n in range(1, min(len(parent), len(parts)) + 1)
                        if parent[-n:] == parts[:n]
                    ),
                    default=0,
                )
                where = _yaml_path([*parent[: len(parent) - k], head])
                msg = rest
        elif err["type"] == "missing":
            msg = "required"
        out.append(f"{where}: {msg}" if where else msg)
    seen: set[str] = set()
    lines = []
    for line in out:
        if line in unions:  # one line per union: each member's requirement, then the value
            if line in seen:
                continue
            seen.add(line)
            msgs, given = unions[line]
            msgs = [re.sub(r" or instance of \w+", "", m) for m in msgs]
            lead = "Input should be "
            if all(m.startswith(lead) for m in msgs):
                said = "should be " + " or ".join(m.removeprefix(lead) for m in msgs)
            else:
                said = "; or ".join(m[0].lower() + m[1:] for m in msgs)
            line = f"{line}: {said} (got {given!r})" if line else said
        lines.append(line)
    return lines


def _yaml_path(loc: Sequence[Any]) -> str:
    s = ""
    for x in loc:
        if isinstance(x, int):
            s += f"[{x}]"
        else:
            s += f".{short_key(x)}" if s else short_key(x)
    return s


def _allowed_keys(root: type, loc: Sequence[Any]) -> list[str]:
    t: Any = root
    for x in loc:
        if isinstance(x, int):
            t = _unwrap(t, item=True)
            continue
        t = _unwrap(t)
        hints = _fields(t)
        if x not in hints:
            return []
        t = hints[x]
    t = _unwrap(t)
    return list(_fields(t))


def _fields(t: Any) -> dict[str, Any]:
    if isinstance(t, type) and issubclass(t, BaseModel):
        return {n: f.annotation for n, f in t.model_fields.items()}
    if dataclasses.is_dataclass(t):
        return {f.name: f.type for f in dataclasses.fields(t)}
    return {}


def _unwrap(t: Any, item: bool = False) -> Any:
    """Optional[X] -> X; list[X] -> X (for item); dict[str, X] | list[...] -> the mapping."""
    origin = get_origin(t)
    if (
        origin is Union
        or str(origin) == "types.UnionType"
        or (origin is not None and origin.__name__ == "UnionType")
    ):
        args = [a for a in get_args(t) if a is not type(None)]
        t = args[0] if args else t
        origin = get_origin(t)
    if item and origin is list:
        return get_args(t)[0]
    return t


def booleans_as_numbers(raw: Any, validated: Any, path: str = "") -> list[str]:
    """Each place where the study writes true or false and the validated value is a number
    (pydantic's lax mode reads ``steps: true`` as 1 step): the YAML path and what is expected.
    ``raw`` is the mapping as written, ``validated`` the model, dataclass or value it became."""
    if isinstance(raw, bool):
        if isinstance(validated, (int, float)) and not isinstance(validated, bool):
            return [f"{path}: {str(raw).lower()} is a boolean; a number is expected here"]
        return []
    out: list[str] = []
    if isinstance(raw, dict):
        for k, v in raw.items():
            if not isinstance(k, str):
                continue
            child = validated.get(k) if isinstance(validated, dict) else getattr(validated, k, None)
            if child is not None:
                out += booleans_as_numbers(v, child, f"{path}.{k}" if path else k)
    elif (
        isinstance(raw, list) and isinstance(validated, list | tuple) and len(raw) == len(validated)
    ):
        for i, (r, v) in enumerate(zip(raw, validated, strict=True)):
            out += booleans_as_numbers(r, v, f"{path}[{i}]")
    return out


def axis_booleans_as_numbers(grids: Any, configs: Sequence[Any]) -> list[str]:
    """``booleans_as_numbers`` for the grid's axes (``grid: {train.steps: [true]}``): an axis
    value written as true or false where the cells' configs hold a number at that path."""
    out: list[str] = []
    for g in grids if isinstance(grids, list) else [grids]:
        if not isinstance(g, dict):
            continue
        for name, values in g.items():
            vals = values if isinstance(values, list) else [values]
            if not isinstance(name, str) or not any(isinstance(v, bool) for v in vals):
                continue
            for cfg in configs:
                held: Any = cfg
                for part in name.split("."):
                    held = getattr(held, part, None)
                if isinstance(held, (int, float)) and not isinstance(held, bool):
                    out.append(f"grid.{name}: a boolean value; numbers are expected on this axis")
                    break
    return out
