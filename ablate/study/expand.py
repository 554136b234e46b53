"""Expanding a study: YAML -> ``StudyFile`` -> ``Study`` with one ``Cell`` per grid point (product per
grid, union over grids, zipped axes, exclusions, baseline), each resolved into a ``RunConfig`` with
its key and label. Every problem is collected and raised as one ``StudyError``."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ablate.data import already_prepared, check_counts, check_sources
from ablate.errors import StudyError
from ablate.study.axes import check_axis_name, fmt_value, get_path, with_values
from ablate.study.cells import Cell, Study
from ablate.study.loader import parse_yaml, read_study_text
from ablate.study.messages import pydantic_errors
from ablate.study.recipe import recipe_axes as derived_recipe_axes
from ablate.study.rungs import ladder_cells
from ablate.study.schema import LIST_AXES, RECIPE_AXES, CellConfig, StudyFile
from ablate.study.tune import check_tune
from ablate.train.config import RunConfig, TrainConfig, config_hash
from backends.recipes import GEMMS

# --- loading ---------------------------------------------------------------------------------------


MAX_CELLS = 10_000
"""Default cap on a study's cells, checked from the axis sizes before anything is expanded."""


def load_study(
    path: str | Path,
    *,
    output: str | Path | None = None,
    check_files: bool = True,
    max_cells: int = MAX_CELLS,
) -> Study:
    """Read, validate and expand a study file; raises ``StudyError`` listing every problem."""
    text = read_study_text(path)
    raw = parse_yaml(text, str(path))
    return parse_study(
        raw,
        text=text,
        source=str(path),
        output=output,
        check_files=check_files,
        max_cells=max_cells,
    )


def parse_study(
    raw: Any,
    *,
    text: str = "",
    source: str | None = None,
    output: str | Path | None = None,
    check_files: bool = True,
    max_cells: int = MAX_CELLS,
) -> Study:
    """Validate and expand an already-parsed study (a mapping, as from YAML); a grid of more than
    ``max_cells`` cells is refused before it is expanded."""
    if not isinstance(raw, dict):
        raise StudyError(
            [f"the study must be a mapping (name:, base:, grid:, ...), got {type(raw).__name__}"],
            source,
        )
    try:
        spec = StudyFile.model_validate(raw)
    except ValidationError as e:
        raise StudyError(pydantic_errors(e, StudyFile), source) from None
    if preset_beside_hf := _preset_beside_hf(raw):
        raise StudyError(preset_beside_hf, source)
    out = Path(output) if output is not None else Path(spec.output or f"runs/{spec.name}")
    study = _expand(spec, raw, source, max_cells)
    study.output_dir = out
    study.text = text
    if spec.tune is not None and (tune_errors := check_tune(spec.tune, study)):
        raise StudyError(tune_errors, source)
    if check_files:
        errors = []
        if (problem := _cache_problem(study)) is not None:
            errors.append(problem)
        for cfg in {
            json.dumps(dataclasses.asdict(c.config.data), sort_keys=True): c.config.data
            for c in study.cells
        }.values():
            try:
                check_sources(cfg)
                # the token counts where the data is prepared already (``ablate run`` prepares
                # it, and checks them, before anything starts)
                if (p := already_prepared(cfg, study.data_cache())) is not None:
                    check_counts(cfg, p)
            except (FileNotFoundError, ValueError) as err:
                varied = any(a.startswith("data.") for a in study.axes)
                errors.append(str(err) if varied else f"base.{err}")
        models = {
            json.dumps([c.config.model.to_dict(), c.config.data.tokenizer], sort_keys=True): c
            for c in study.cells
        }
        for c in models.values():
            if (msg := _model_fits_tokenizer(c.config)) is not None:
                varied = any(a.startswith(("data.", "model.")) for a in study.axes)
                errors.append(f"cell {c.label}: {msg}" if varied else f"base.{msg}")
        if errors:
            raise StudyError(errors, source)
    return study


def _preset_beside_hf(raw: dict[str, Any]) -> list[str]:
    """A ``model.preset`` the study writes beside a ``model.hf`` it writes (in the base, or one in
    the base and the other on a grid axis): refused, not dropped, since the architecture's config
    sets every shape. Read from the file as written: a preset left to its default is no conflict."""
    base: dict[str, Any] = raw["base"] if isinstance(raw.get("base"), dict) else {}
    model: dict[str, Any] = base["model"] if isinstance(base.get("model"), dict) else {}
    written = {k for k in ("preset", "hf") if model.get(k) is not None}
    grids = raw.get("grid")
    axes: set[str] = set()
    for g in grids if isinstance(grids, list) else [grids]:
        if isinstance(g, dict):
            for name, values in g.items():
                if name in ("model.preset", "model.hf") and any(
                    v is not None for v in (values if isinstance(values, list) else [values])
                ):
                    axes.add(name.removeprefix("model."))
    if written == {"preset", "hf"}:
        return [
            f"base.model.preset: {model['preset']!r} is not allowed with model.hf (the "
            "architecture's config sets every shape); remove one of them"
        ]
    clash = (written | axes) >= {"preset", "hf"} and axes
    if clash:
        return [
            "model.preset and model.hf: one is in the base and the other on a grid axis, so every "
            "cell would have both (a preset beside hf is refused: the architecture's config sets "
            "every shape); vary model as a whole instead (grid: {model: [{preset: ...}, {hf: ...}]})"
        ]
    return []


def _cache_problem(study: Study) -> str | None:
    """What stops the prepared-data cache from being used: a file where its folder goes, or a
    folder (or the nearest existing parent of a new one) this process cannot write."""
    from ablate.data.prepared import CACHE_ENV

    cache = study.data_cache()
    field = "data_cache" if study.file.data_cache else f"${CACHE_ENV} (the prepared-data cache)"
    there = next((p for p in (cache, *cache.parents) if p.exists()), None)
    if there is None:
        return None
    if not there.is_dir():
        return f"{field}: {there} is a file, not a folder; give a folder for prepared data"
    if not os.access(there, os.W_OK | os.X_OK):
        return f"{field}: {there} is not writable; give a folder this user can write"
    return None


def _model_fits_tokenizer(rc: RunConfig) -> str | None:
    """What is wrong with ``rc``'s model for its tokenizer, checked before anything starts: a
    tokenizer file that does not load; a vocabulary (``model.vocab_size``, or a ``model.hf``
    architecture's) smaller than the tokenizer's. A hub tokenizer is checked from the Hugging Face
    cache, or not here when it is not cached yet (``preflight.check_hub``)."""
    from ablate.data import load_tokenizer
    from ablate.data.tokenizer import tokenizer_kind
    from ablate.model.hf import check_config

    spec = rc.data.tokenizer
    try:
        kind = tokenizer_kind(spec)
        if kind == "hub":  # from the cache; else fetched by `run` (preflight.check_hub)
            try:
                vocab = load_tokenizer(spec, offline=True).vocab_size
            except FileNotFoundError:
                return None
        else:
            vocab = load_tokenizer(spec).vocab_size
        if rc.model.hf is not None:
            check_config(rc.model.hf, vocab_size=vocab, seq_len=None)
        elif rc.model.vocab_size is not None and rc.model.vocab_size < vocab:
            return (
                f"model.vocab_size: {rc.model.vocab_size} is smaller than the vocabulary of "
                f"data.tokenizer {spec!r} ({vocab}); raise it, or leave it unset (the tokenizer's)"
            )
    except (FileNotFoundError, ValueError, ImportError) as e:
        return str(e)
    return None


def _expand(spec: StudyFile, raw: dict[str, Any], source: str | None, max_cells: int) -> Study:
    errors: list[str] = []
    base = spec.base.model_dump(mode="python")
    raw_base = raw.get("base") or {}
    raw_train = raw_base.get("train") or {} if isinstance(raw_base, dict) else {}
    grids = spec.grid if isinstance(spec.grid, list) else [spec.grid]
    grid_paths = (
        ["grid"] if isinstance(spec.grid, dict) else [f"grid[{i}]" for i in range(len(grids))]
    )

    # 1. every axis value, checked on its own against the base: factor = list of options, an
    #    option = ((axis, canonical value), ...) (several axes when zipped)
    axes: list[str] = []
    followers: set[str] = set()  # zipped axes after the first of their group (it names them)
    per_grid: list[list[list[tuple[tuple[str, Any], ...]]]] = []
    for g, gpath in zip(grids, grid_paths, strict=True):
        factors: list[list[tuple[tuple[str, Any], ...]]] = []
        for name, values in g.items():
            if name == "zip":
                groups = values if isinstance(values, list) else [values]
                for k, group in enumerate(groups):
                    zpath = f"{gpath}.zip" + (f"[{k}]" if isinstance(values, list) else "")
                    factors.append(_zip_factor(group, zpath, base, errors, axes))
                    followers.update(list(group)[1:])
            else:
                factors.append(
                    [(o,) for o in _axis_options(name, values, f"{gpath}.{name}", base, errors)]
                )
                if name not in axes and not check_axis_name(name):
                    axes.append(name)
        per_grid.append(factors)
    if errors:
        raise StudyError(errors, source)
    sizes = [math.prod(len(f) for f in factors) for factors in per_grid]
    if sum(sizes) > max_cells:
        shape = " + ".join("x".join(str(len(f)) for f in factors) or "1" for factors in per_grid)
        raise StudyError(
            [
                f"grid: {sum(sizes):,} cells ({shape}) is more than the {max_cells:,} allowed; "
                "narrow an axis, or raise the cap with --max-cells if you mean it"
            ],
            source,
        )

    # 2. cells: the product of each grid, the union over grids; every axis gets a value (the
    #    base's where a grid does not set it), so exclude/baseline can name any axis
    combos: list[dict[str, Any]] = []
    for factors in per_grid:
        for choice in itertools.product(*factors):
            vals = {a: get_path(base, a) for a in axes}
            vals.update({a: v for option in choice for (a, v) in option})
            combos.append(vals)

    # 3. exclusions and the baseline
    exclude = [_match_spec(e, f"exclude[{i}]", axes, errors) for i, e in enumerate(spec.exclude)]
    baseline = (
        _match_spec(spec.baseline, "baseline", axes, errors) if spec.baseline is not None else None
    )
    if errors:
        raise StudyError(errors, source)
    used = [False] * len(exclude)
    kept: list[dict[str, Any]] = []
    for vals in combos:
        hit = [i for i, m in enumerate(exclude) if _matches(m, vals)]
        for i in hit:
            used[i] = True
        if not hit:
            kept.append(vals)
    for i, u in enumerate(used):
        if not u:
            errors.append(f"exclude[{i}]: matches no cell of the grid; check its axes and values")
    if combos and not kept:
        errors.append("exclude: removes every cell; the study has nothing to run")
    if errors:
        raise StudyError(errors, source)

    # 4. resolve every cell into a RunConfig (combinations can be impossible)
    resolved: list[tuple[dict[str, Any], RunConfig, dict[str, Any]]] = []
    failed: list[tuple[str, list[str]]] = []  # (the cell's values, its errors)
    for vals in kept:
        try:
            cc = CellConfig.model_validate(with_values(base, vals))
            rc = cc.run_config()
        except (ValidationError, ValueError) as e:
            what = ", ".join(f"{a}: {fmt_value(v)}" for a, v in vals.items())
            msgs = pydantic_errors(e, CellConfig) if isinstance(e, ValidationError) else [str(e)]
            failed.append((what, msgs))
            continue
        if "checkpoint_every" not in raw_train and rc.train.checkpoint_every == 0:
            rc.train.checkpoint_every = rc.train.eval_every  # resumable by default
        if spec.baseline_extend and baseline is not None and _matches(baseline, vals):
            if rc.train.schedule_end != rc.train.steps:
                msg = (
                    "baseline_extend: the baseline's cells set train.schedule_steps themselves; "
                    "give one or the other"
                )
                if msg not in errors:
                    errors.append(msg)
                continue
            rc.train = extended(rc.train, spec.baseline_extend)
        if rc.device == "auto":  # from the study, not from the machine a command runs on
            rc.device = "cuda" if spec.resources.gpus > 0 else "cpu"
        if rc.train.workers != spec.resources.workers:
            errors.append(
                "train.workers: set by resources.workers (processes per cell), not a grid axis"
            )
        parallel = rc.train.resolved_parallel
        if spec.probe is not None and parallel != "none":
            msg = (
                f"probe: probes run in one process (train.parallel: none), but the cells train "
                f"with {parallel} over resources.workers: {spec.resources.workers}; drop the probe "
                "section"
            )
            if msg not in errors:
                errors.append(msg)
        if spec.probe is not None:  # the same probes for every cell; not part of its key
            rc.probe = spec.probe
            errors.extend(m for m in spec.probe.problems(rc) if m not in errors)
        recipe_axes = derived_recipe_axes(rc.recipe, cc.base_format)
        resolved.append((vals, rc, recipe_axes))
    shared = {tuple(m) for _, m in failed}
    if len(failed) == len(kept) > 1 and len(shared) == 1:  # the base is wrong, not a combination
        errors[:0] = [f"{m} (in every cell)" for m in failed[0][1]]
    else:
        hint = "; drop impossible cells with `exclude`" if len(kept) > 1 else ""
        errors[:0] = [f"cell {{{w}}}: {m}{hint}" for w, ms in failed for m in ms]
    if errors:
        more = [f"... and {len(errors) - 20} more"] if len(errors) > 20 else []
        raise StudyError(errors[:20] + more, source)

    varying = [a for a in axes if len({fmt_value(v[a]) for v, _, _ in resolved}) > 1]
    cells: list[Cell] = []
    notes: list[str] = []
    seen: dict[str, int] = {}
    for vals, rc, recipe_axes in resolved:
        key = config_hash(rc)
        label, config_label = _labels(rc, vals, varying)
        is_base = baseline is not None and _matches(baseline, vals)
        if key in seen:
            prev = cells[seen[key]]
            notes.append(f"{label} and {prev.label} resolve to the same config; it runs once")
            if is_base and not prev.baseline:
                cells[seen[key]] = dataclasses.replace(prev, baseline=True)
            continue
        seen[key] = len(cells)
        cells.append(
            Cell(key, label, config_label, vals, rc, is_base, recipe_axes, frozenset(followers))
        )
    label_counts = Counter(c.label for c in cells)
    dup_labels = sorted(x for x, n in label_counts.items() if n > 1)
    if dup_labels:
        errors.append(
            f"cells {', '.join(dup_labels)} differ but share a label: give each recipe variant "
            "its own label (recipe: {..., label: ...}), or an axis that tells them apart"
        )

    if spec.ladder is not None:
        cells, ladder_errors = ladder_cells(spec.ladder, cells, axes)
        errors.extend(ladder_errors)
    if baseline is not None:
        configs = sorted(
            {c.ladder_config if spec.ladder else c.config_label for c in cells if c.baseline}
        )
        if not configs:
            errors.append(
                f"baseline: {fmt_value(spec.baseline)} matches no cell; the cells have "
                + _axes_summary(cells, axes)
            )
        elif len(configs) > 1:
            errors.append(
                f"baseline: matches {len(configs)} configurations ({', '.join(configs)}); "
                "add axes to select exactly one (its seeds are the baseline)"
            )
    if errors:
        raise StudyError(errors, source)
    return Study(
        file=spec, cells=cells, axes=axes, output_dir=Path("."), source=source, notes=notes
    )


def extended(train: TrainConfig, fraction: float) -> TrainConfig:
    """A baseline cell's training under ``baseline_extend: fraction``: ceil(fraction x steps)
    more steps after the schedule of ``train.steps`` (``TrainConfig.schedule_steps``)."""
    more = math.ceil(fraction * train.steps - 1e-9)
    return dataclasses.replace(train, steps=train.steps + more, schedule_steps=train.steps)


def _zip_factor(
    group: Any, zpath: str, base: dict[str, Any], errors: list[str], axes: list[str]
) -> list[tuple[tuple[str, Any], ...]]:
    """The zipped axes' tuples; the i-th value of each axis is validated together with the i-th
    values of the others (a model shape's dim, heads and widths only make sense together)."""
    if not isinstance(group, dict) or not group:
        errors.append(f"{zpath}: must map axes to equal-length lists, e.g. {{train.lr: [..], ...}}")
        return []
    raw = {n: v for n, v in group.items() if isinstance(v, list)}
    lengths = {len(v) for v in raw.values()}
    together = None
    if len(lengths) == 1 and len(raw) == len(group):
        (n_values,) = lengths
        together = [{n: v[i] for n, v in raw.items()} for i in range(n_values)]
    cols: list[list[tuple[str, Any]]] = []
    for name, values in group.items():
        cols.append(_axis_options(name, values, f"{zpath}.{name}", base, errors, together))
        if name not in axes and not check_axis_name(name):
            axes.append(name)
    lengths = {len(c) for c in cols}
    if len(lengths) > 1:
        sizes = ", ".join(f"{n}: {len(c)}" for n, c in zip(group, cols, strict=True))
        errors.append(f"{zpath}: zipped axes must have equal lengths ({sizes})")
        return []
    return list(zip(*cols, strict=True))


def _axis_options(
    name: str,
    values: Any,
    path: str,
    base: dict[str, Any],
    errors: list[str],
    together: list[dict[str, Any]] | None = None,
) -> list[tuple[str, Any]]:
    """[(axis, canonical value)] for one axis, each value validated on top of the base (with
    ``together[i]``, the values zipped with value i, beside it)."""
    problem = check_axis_name(name)
    if problem:
        errors.append(f"{path}: {problem}")
        return []
    if not isinstance(values, list):
        errors.append(
            f"{path}: an axis is a list of values, got {fmt_value(values)} (write [{fmt_value(values)}])"
        )
        return []
    if not values:
        errors.append(f"{path}: empty list; an axis needs at least one value")
        return []
    out: list[tuple[str, Any]] = []
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
    return out


def _labels(rc: RunConfig, vals: Mapping[str, Any], varying: Sequence[str]) -> tuple[str, str]:
    """(label, config label): the recipe's short form (when a recipe axis varies, or nothing else
    does), then the other varying axes as leaf=value, then seedN."""
    parts: list[str] = []
    # the recipe's short form leaves the scale mode out (it is in the recipe's hashed dict, so its
    # label cannot change without changing keys): a varying scale mode is named like other axes
    others = [a for a in varying if (a not in RECIPE_AXES or a == "scale_mode") and a != "seed"]
    if any(a in RECIPE_AXES for a in varying) or not others:
        parts.append(rc.recipe.short())
    parts.extend(f"{a.rpartition('.')[2]}={fmt_value(vals[a])}" for a in others)
    config_label = "/".join(parts)
    if "seed" in varying:
        return f"{config_label}/seed{rc.seed}", config_label
    return config_label, config_label


def _axes_summary(cells: Sequence[Cell], axes: Sequence[str]) -> str:
    parts = []
    for a in axes:
        vals = sorted({fmt_value(c.values[a]) for c in cells})
        parts.append(f"{a} in {{{', '.join(vals)}}}")
    return "; ".join(parts) or "no axes"


# --- matching cells (exclude, baseline) ------------------------------------------------------------


def _match_spec(
    spec: Mapping[str, Any], path: str, axes: Sequence[str], errors: list[str]
) -> dict[str, list[Any]]:
    """{axis: [allowed canonical values]} from an exclude/baseline mapping."""
    out: dict[str, list[Any]] = {}
    if not spec:
        errors.append(f"{path}: empty; name at least one axis and its value(s)")
    for name, v in spec.items():
        if name not in axes:
            errors.append(
                f"{path}.{name}: not an axis of this study; axes: {', '.join(axes) or 'none'}"
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
    return out


def _matches(m: Mapping[str, list[Any]], vals: Mapping[str, Any]) -> bool:
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
