"""A study's grid, the first phases of its expansion (``ablate.study.expand``): every axis value
checked on its own against the base (``grid_of``), the cells as axis values (``Grid.combos``: the
product of each grid, the union over grids), and the cells an ``exclude`` leaves (``kept``), with
how ``exclude`` and ``baseline`` match a cell's axis values (``matchers``, ``matches``). Each phase
returns its data and its errors; none raises."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ablate.study.axes import check_axis_name, fmt_value, get_path, with_values
from ablate.study.messages import pydantic_errors, short_key
from ablate.study.schema import LIST_AXES, CellConfig, StudyFile
from backends.recipes import GEMMS

Option = tuple[tuple[str, Any], ...]
"""One choice of a factor: ((axis, canonical value), ...), several axes when zipped."""
Factor = list[Option]
"""The choices of one axis, or of one group of zipped axes."""
Matcher = dict[str, list[Any]]
"""An exclude or baseline entry: {axis: [the canonical values it matches]}."""


@dataclass(frozen=True)
class Grid:
    """A study's grids with every axis value checked: per grid its factors."""

    axes: list[str]
    """Every axis, in the order the grids name them."""
    followers: frozenset[str]
    """Zipped axes after the first of their group (which names them in a run's short name)."""
    grids: list[list[Factor]]

    def too_big(self, max_cells: int) -> str | None:
        """The error when the grids hold more than ``max_cells`` cells (counted, not expanded)."""
        sizes = [math.prod(len(f) for f in factors) for factors in self.grids]
        if sum(sizes) <= max_cells:
            return None
        shape = " + ".join("x".join(str(len(f)) for f in factors) or "1" for factors in self.grids)
        return (
            f"grid: {sum(sizes):,} cells ({shape}) is more than the {max_cells:,} allowed; "
            "narrow an axis, or raise the cap with --max-cells if you mean it"
        )

    def combos(self, base: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every cell's axis values: the product of each grid, the union over grids; every axis
        gets a value (the base's where a grid does not set it), so exclude/baseline can name any
        axis."""
        out: list[dict[str, Any]] = []
        for factors in self.grids:
            for choice in itertools.product(*factors):
                vals = {a: get_path(base, a) for a in self.axes}
                vals.update({a: v for option in choice for (a, v) in option})
                out.append(vals)
        return out


def grid_of(spec: StudyFile, base: dict[str, Any]) -> tuple[Grid, list[str]]:
    """The study's grids, each axis value checked on its own against the base; and the errors."""
    grids = spec.grid if isinstance(spec.grid, list) else [spec.grid]
    paths = ["grid"] if isinstance(spec.grid, dict) else [f"grid[{i}]" for i in range(len(grids))]
    errors: list[str] = []
    axes: list[str] = []
    followers: set[str] = set()

    def add_axis(name: str) -> None:
        if name not in axes and not check_axis_name(name):
            axes.append(name)

    per_grid: list[list[Factor]] = []
    for g, gpath in zip(grids, paths, strict=True):
        factors: list[Factor] = []
        for name, values in g.items():
            if name == "zip":
                groups = values if isinstance(values, list) else [values]
                for k, group in enumerate(groups):
                    zpath = f"{gpath}.zip" + (f"[{k}]" if isinstance(values, list) else "")
                    factor, names, errs = _zip_factor(group, zpath, base)
                    factors.append(factor)
                    errors.extend(errs)
                    for n in names:
                        add_axis(n)
                    followers.update(names[1:])
            else:
                options, errs = _axis_options(name, values, f"{gpath}.{short_key(name)}", base)
                factors.append([(o,) for o in options])
                errors.extend(errs)
                add_axis(name)
        per_grid.append(factors)
    return Grid(axes, frozenset(followers), per_grid), errors


def _zip_factor(
    group: Any, zpath: str, base: dict[str, Any]
) -> tuple[Factor, list[str], list[str]]:
    """(the zipped axes' tuples, the axes it names, errors); the i-th value of each axis is
    validated together with the i-th values of the others (a model shape's dim, heads and widths
    only make sense together)."""
    if not isinstance(group, dict) or not group:
        return (
            [],
            [],
            [f"{zpath}: must map axes to equal-length lists, e.g. {{train.lr: [..], ...}}"],
        )
    raw = {n: v for n, v in group.items() if isinstance(v, list)}
    lengths = {len(v) for v in raw.values()}
    together = None
    if len(lengths) == 1 and len(raw) == len(group):
        (n_values,) = lengths
        together = [{n: v[i] for n, v in raw.items()} for i in range(n_values)]
    errors: list[str] = []
    cols: list[list[tuple[str, Any]]] = []
    for name, values in group.items():
        col, errs = _axis_options(name, values, f"{zpath}.{short_key(name)}", base, together)
        cols.append(col)
        errors.extend(errs)
    names = list(group)
    if len({len(c) for c in cols}) > 1:
        sizes = ", ".join(f"{n}: {len(c)}" for n, c in zip(group, cols, strict=True))
        return [], names, [*errors, f"{zpath}: zipped axes must have equal lengths ({sizes})"]
    return list(zip(*cols, strict=True)), names, errors


def _axis_options(
    name: str,
    values: Any,
    path: str,
    base: dict[str, Any],
    together: list[dict[str, Any]] | None = None,
) -> tuple[list[tuple[str, Any]], list[str]]:
    """([(axis, canonical value)], errors) for one axis, each value validated on top of the base
    (with ``together[i]``, the values zipped with value i, beside it)."""
    problem = check_axis_name(name)
    if problem:
        return [], [f"{path}: {problem}"]
    if not isinstance(values, list):
        v = fmt_value(values)
        return [], [f"{path}: an axis is a list of values, got {v} (write [{v}])"]
    if not values:
        return [], [f"{path}: empty list; an axis needs at least one value"]
    out: list[tuple[str, Any]] = []
    errors: list[str] = []
    for i, v in enumerate(values):
        beside = {**together[i], name: v} if together is not None else {name: v}
        try:
            cfg = CellConfig.model_validate(with_values(base, beside))
        except ValidationError as e:
            for m in pydantic_errors(e, CellConfig):
                rest = m[len(name) :] if m.startswith(name) and m[len(name)] in ":[." else f": {m}"
                errors.append(f"{path}[{i}]{rest}")
            continue
        out.append((name, get_path(cfg.model_dump(mode="python"), name)))
    return out, errors


def kept(
    combos: list[dict[str, Any]], exclude: list[Matcher]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The cells no ``exclude`` entry matches; and the errors: an entry that matches no cell, an
    exclusion of every cell."""
    used = [False] * len(exclude)
    out: list[dict[str, Any]] = []
    for vals in combos:
        hit = [i for i, m in enumerate(exclude) if matches(m, vals)]
        for i in hit:
            used[i] = True
        if not hit:
            out.append(vals)
    errors = [
        f"exclude[{i}]: matches no cell of the grid; check its axes and values"
        for i, u in enumerate(used)
        if not u
    ]
    if combos and not out:
        errors.append("exclude: removes every cell; the study has nothing to run")
    return out, errors


def matchers(
    spec: StudyFile, axes: Sequence[str]
) -> tuple[tuple[list[Matcher], Matcher | None], list[str]]:
    """(the ``exclude`` entries' matchers, the ``baseline``'s or None); and their errors."""
    found = [matcher(e, f"exclude[{i}]", axes) for i, e in enumerate(spec.exclude)]
    if spec.baseline is not None:
        found.append(matcher(spec.baseline, "baseline", axes))
    out = [m for m, _ in found]
    baseline = out.pop() if spec.baseline is not None else None
    return (out, baseline), [msg for _, errors in found for msg in errors]


def matcher(spec: Mapping[str, Any], path: str, axes: Sequence[str]) -> tuple[Matcher, list[str]]:
    """{axis: [allowed canonical values]} from an exclude/baseline mapping; and the errors."""
    out: Matcher = {}
    errors: list[str] = []
    if not spec:
        errors.append(f"{path}: empty; name at least one axis and its value(s)")
    for name, v in spec.items():
        if name not in axes:
            errors.append(
                f"{path}.{short_key(name)}: not an axis of this study; axes: {', '.join(axes) or 'none'}"
            )
            continue
        if name in LIST_AXES:
            options = (
                v if isinstance(v, list) and v and all(isinstance(x, list) for x in v) else [v]
            )
            canon = []
            for o in options:
                if not isinstance(o, list) or any(g not in GEMMS for g in o):
                    errors.append(
                        f"{path}.{name}: {fmt_value(o)} is not a list of GEMMs; allowed: "
                        f"{', '.join(GEMMS)}"
                    )
                    continue
                canon.append([g for g in GEMMS if g in o])
            out[name] = canon
        else:
            out[name] = v if isinstance(v, list) else [v]
    return out, errors


def matches(m: Matcher, vals: Mapping[str, Any]) -> bool:
    """Do a cell's axis values match every axis of ``m``? (Numbers compare as numbers, so 3e-3
    and 0.003 are the same; GEMM lists compare as sets.)"""
    return all(any(_same(vals[axis], o) for o in options) for axis, options in m.items())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and sorted(a) == sorted(b)
    try:
        return bool(float(a) == float(b))
    except (TypeError, ValueError):
        return str(a) == str(b)
