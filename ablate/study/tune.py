"""The ``tune:`` section of a study: what Optuna searches, for which cells, and how.

The schema (``TuneSection`` in ``study.schema``) and these checks are part of the study, validated
with the rest of the study before anything runs; the Optuna driver is ``ablate.tune``. Example::

    tune:
      per: [base_format, fp4_gemms]     # one independent search per distinct value of these axes
      objective: final_val_loss         # or tokens_to_target (needs the study's target)
      trials: 8                         # per search, counting trials already done
      parallelism: 2                    # trials in flight per search (Ray executor)
      sampler: {kind: tpe, seed: 0, startup_trials: 4}
      pruner: {kind: threshold, max_val_loss: 6.0}
      space:
        train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}
        train.warmup_steps: {low: 0, high: 20}          # int: train.warmup_steps is an int
        intervention: {choices: [none, sr, dht]}
      enqueue:                          # tried first, when a search starts
        - {train.lr: 3.0e-3, train.warmup_steps: 10, intervention: none}

**Searches.** ``per`` names axes of the grid (or ``config``: one search per configuration, i.e. per
cell label without the seed). Each distinct combination of their values among the study's cells is
one search, with its own Optuna study named ``<study>/<search label>`` and its own pruner: trials of
different searches are never compared. A search starts from its first cell (in study order) with
the lowest seed; trials change only the ``space`` paths. ``per: []`` is a single search.

**Space.** Keys are the grid's axis names (dotted config paths such as ``train.lr``, or recipe
shorthands such as ``intervention``). A parameter is a range (``low``, ``high``, optional ``log``
or ``step``; an int range when ``type: int`` or when the config field is an int, and ``type:
float`` on an int field is refused) or ``choices`` (numbers, strings, booleans; not lists: vary
list-valued axes such as ``fp4_gemms`` with ``per``).

Everything is checked with the rest of the study, before anything runs, by ``check_tune``: each
problem names its YAML path (``tune.space.train.lr.low: ...``). Bounds and choices are validated
as cell configs on top of every search's starting cell, so a value the trainer would refuse fails
here and not in trial 17.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ablate.study.axes import check_axis_name, fmt_value, with_values
from ablate.study.cells import Cell, Study
from ablate.study.messages import pydantic_errors, short_key
from ablate.study.schema import (
    RECIPE_AXES,
    SECTIONS,
    CellConfig,
    ParamKind,
    PrunerOptions,
    SearchParam,
    TuneSection,
)
from ablate.train.config import RunConfig

# --- searches --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Search:
    """One independent Optuna study: a group of cells and the cell its trials start from."""

    label: str
    """Readable and unique: the recipe (``per`` of recipe axes), the config label, or axis=value."""
    slug: str
    """The label as a folder name."""
    cell: Cell
    values: dict[str, Any]
    """Value of each ``per`` axis."""


def plan_searches(tune: TuneSection, study: Study) -> list[Search]:
    """The searches of a study, in order of their first cell."""
    groups: dict[tuple[str, ...], list[Cell]] = {}
    for c in study.cells:
        ident = tuple(c.config_label if a == "config" else fmt_value(c.values[a]) for a in tune.per)
        groups.setdefault(ident, []).append(c)
    reps = [min(cells, key=lambda c: c.seed) for cells in groups.values()]  # stable: first lowest

    def label(c: Cell, style: str) -> str:
        if not tune.per:
            return "all"
        if style == "recipe":
            return c.config.recipe.short()
        if tune.per == ["config"]:
            return c.config_label
        return ",".join(
            f"{a.rpartition('.')[2]}={c.config_label if a == 'config' else fmt_value(c.values[a])}"
            for a in tune.per
        )

    style = "recipe" if tune.per and all(a in RECIPE_AXES for a in tune.per) else "axes"
    labels = [label(c, style) for c in reps]
    if len(set(labels)) < len(labels):  # e.g. an intervention that changes nothing
        labels = [label(c, "axes") for c in reps]
    slugs: list[str] = []
    for lab in labels:
        slug = re.sub(r"[^A-Za-z0-9_.=+-]+", "-", lab).strip("-") or "search"
        while slug in slugs:
            slug += "_"
        slugs.append(slug)
    return [
        Search(
            lab, slug, c, {a: c.config_label if a == "config" else c.values[a] for a in tune.per}
        )
        for lab, slug, c in zip(labels, slugs, reps, strict=True)
    ]


def trial_config(study: Study, cell: Cell, params: dict[str, Any]) -> RunConfig:
    """``cell``'s config with ``params`` (config path -> value) applied; raises pydantic's
    ValidationError or ValueError for a config the trainer would refuse."""
    base = with_values(study.file.base.model_dump(mode="python"), dict(cell.values))
    rc = CellConfig.model_validate(with_values(base, params)).run_config()
    if "train.checkpoint_every" not in params:  # the study's default (resumable cells) applies
        rc.train.checkpoint_every = cell.config.train.checkpoint_every
    return rc


def param_kind(path: str, p: SearchParam) -> ParamKind:
    if p.choices is not None:
        return "categorical"
    if p.type is not None:
        return p.type
    return "int" if _is_int_field(path) else "float"


def _is_int_field(path: str) -> bool:
    """Whether the config field at ``path`` takes only integers (its annotation)."""
    hint = _field_type(path)
    types = typing.get_args(hint) or (hint,)  # int | None (model.dim) is an int field too
    return int in types and float not in types


def _field_type(path: str) -> Any:
    section, _, name = path.rpartition(".")
    if section in SECTIONS:
        return typing.get_type_hints(SECTIONS[section]).get(name)
    field = CellConfig.model_fields.get(name)
    return field.annotation if field is not None else None


# --- checks ------------------------------------------------------------------------------------------


def check_tune(tune: TuneSection, study: Study) -> list[str]:
    """Every problem of a study's ``tune`` section, as ``"tune.path: what is wrong"`` lines."""
    errors: list[str] = []
    for i, a in enumerate(tune.per):
        if a != "config" and a not in study.axes:
            errors.append(
                f"tune.per[{i}]: {a!r} is not an axis of this study; axes: "
                f"{', '.join(study.axes) or 'none'} (or config: one search per configuration)"
            )
    if tune.objective == "tokens_to_target" and study.target is None:
        errors.append(
            "tune.objective: tokens_to_target needs the study's target (target: {val_loss: ...}, {val_ppl: ...}, "
            "or a baseline); or use final_val_loss"
        )
    if tune.direction == "maximize":
        errors.append(
            f"tune.direction: {tune.objective} is a cost; only minimize finds the best parameters"
        )
    if tune.pruner is not None:
        errors += _check_pruner(tune.pruner)
    if not tune.space:
        errors.append(
            "tune.space: empty; name at least one config path to search, e.g. "
            "{train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}}"
        )
    searches = plan_searches(tune, study) if not errors else []
    for path, p in tune.space.items():
        where = f"tune.space.{short_key(path)}"
        problem = check_axis_name(path)
        if problem:
            errors.append(f"{where}: {problem}")
            continue
        if path in ("seed", "device"):
            errors.append(f"{where}: {path} is not a hyperparameter; vary it in the grid")
            continue
        if path in tune.per:
            errors.append(f"{where}: also in tune.per; a path is either searched or split on")
            continue
        shape = _check_shape(path, p, where)
        errors += shape
        if not shape:
            values = p.choices if p.choices is not None else [p.low, p.high]
            names = (
                [f"choices[{k}]" for k in range(len(values))]
                if p.choices is not None
                else ["low", "high"]
            )
            for v, name in zip(values, names, strict=True):
                errors += _check_value(study, searches, path, v, f"{where}.{name}")
    for i, entry in enumerate(tune.enqueue):
        errors += _check_enqueued(tune, entry, f"tune.enqueue[{i}]")
    return errors


def _check_pruner(p: PrunerOptions) -> list[str]:
    used = {"threshold": {"max_val_loss"}, "median": {"startup_trials"}}.get(p.kind, set())
    used |= {"patience", "min_delta"} if p.kind == "patient" else set()
    errors = [
        f"tune.pruner.{name}: not used by kind {p.kind}"
        for name in ("max_val_loss", "startup_trials", "patience", "min_delta")
        if name in p.model_fields_set and name not in used
    ]
    if p.kind == "threshold" and (p.max_val_loss is None or not p.max_val_loss > 0):
        errors.append(
            f"tune.pruner.max_val_loss: the threshold pruner needs a positive ceiling, got "
            f"{p.max_val_loss} (e.g. max_val_loss: 6.0, above ln(vocab) = untrained)"
        )
    return errors


def _check_shape(path: str, p: SearchParam, where: str) -> list[str]:
    kind = param_kind(path, p)
    if p.choices is not None:
        if p.type not in (None, "categorical"):
            return [f"{where}.type: {p.type} takes low/high, not choices"]
        extra = [n for n in ("low", "high", "step") if getattr(p, n) is not None]
        extra += ["log"] if p.log else []
        if extra:
            return [f"{where}.{extra[0]}: not with choices; give a range or choices"]
        if not p.choices:
            return [f"{where}.choices: empty; a categorical parameter needs at least one choice"]
        return [
            f"{where}.choices[{k}]: {c!r} cannot be an Optuna choice; use numbers, strings, "
            "booleans or null (vary list-valued axes such as fp4_gemms with tune.per)"
            for k, c in enumerate(p.choices)
            if not (c is None or isinstance(c, bool | int | float | str))
        ]
    if kind == "categorical":
        return [f"{where}.choices: required for type categorical"]
    if kind == "float" and _is_int_field(path):
        return [
            f"{where}.type: float, but {path} is an int field, which refuses fractional values "
            "(allowed: int, or leave type out)"
        ]
    missing = [n for n in ("low", "high") if getattr(p, n) is None]
    if missing:
        return [f"{where}.{n}: required for a range (or give choices: [...])" for n in missing]
    assert p.low is not None and p.high is not None
    errors = [
        f"{where}.{n}: must be a finite number, got {getattr(p, n)}"
        for n in ("low", "high", "step")
        if getattr(p, n) is not None and not math.isfinite(getattr(p, n))
    ]
    if kind == "int" and not errors:
        for n in ("low", "high", "step"):
            v = getattr(p, n)
            if v is not None and float(v) != int(v):
                errors.append(f"{where}.{n}: {v} is not an integer ({path} is an int)")
    if errors:
        return errors
    if p.low >= p.high:
        errors.append(
            f"{where}.low: {p.low:g} is not below high ({p.high:g}); a range needs low < high"
        )
    if p.log and p.low <= 0:
        errors.append(
            f"{where}.low: a log range must be positive, got {p.low:g} (log(0) is -inf); "
            f"raise low, e.g. to {p.high * 1e-3:g}, or drop log"
        )
    if p.step is not None:
        if p.log:
            errors.append(f"{where}.step: not with log; give one of them")
        elif not p.step > 0:
            errors.append(f"{where}.step: must be > 0, got {p.step}")
    return errors


def _check_value(
    study: Study, searches: list[Search], path: str, value: Any, where: str
) -> list[str]:
    """Is ``path = value`` a config the trainer accepts, on top of every search's start cell?"""
    for s in searches:
        try:
            trial_config(study, s.cell, {path: value})
        except ValidationError as e:
            msgs = pydantic_errors(e, CellConfig)
            return [f"{where}: {m.removeprefix(path + ': ')}" for m in msgs]
        except ValueError as e:
            return [f"{where}: {e} (in search {s.label})"]
    return []


def _check_enqueued(tune: TuneSection, entry: dict[str, Any], where: str) -> list[str]:
    errors: list[str] = []
    for path, v in entry.items():
        p = tune.space.get(path)
        if p is None:
            errors.append(
                f"{where}.{path}: not in tune.space; searched: {', '.join(tune.space) or 'none'}"
            )
        elif p.choices is not None:
            if v not in p.choices:
                errors.append(f"{where}.{path}: {v!r} is not one of the choices {p.choices}")
        elif p.low is not None and p.high is not None:
            ok = isinstance(v, int | float) and not isinstance(v, bool)
            if not ok or not p.low <= v <= p.high:
                errors.append(f"{where}.{path}: {v!r} is outside [{p.low:g}, {p.high:g}]")
            elif param_kind(path, p) == "int" and v != int(v):
                errors.append(f"{where}.{path}: {v!r} is not an integer ({path} is an int)")
    return errors
