"""Expanding a study: YAML -> ``StudyFile`` -> ``Study`` with one ``Cell`` per grid point (product per
grid, union over grids, zipped axes, exclusions, baseline), each resolved into a ``RunConfig`` with
its key and label. Every problem is collected and raised as one ``StudyError``. Also where a
study's ``baseline_from`` points (``baseline_source``: the study file it names is loaded here)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from ablate.data import already_prepared, check_counts, check_sources
from ablate.errors import StudyError
from ablate.study.axes import fmt_value, with_values
from ablate.study.baseline_from import BaselineFrom, BaselineSource
from ablate.study.cells import Cell, Study
from ablate.study.grid import Grid, Matcher, grid_of, kept, matchers, matches
from ablate.study.loader import parse_yaml, read_study_text
from ablate.study.messages import axis_booleans_as_numbers, booleans_as_numbers, pydantic_errors
from ablate.study.phases import timeline_axes
from ablate.study.recipe import recipe_axes
from ablate.study.rungs import ladder_cells
from ablate.study.schema import RECIPE_AXES, CellConfig, StudyFile
from ablate.study.seeds import plan_problems, with_seed_axis
from ablate.study.tune import check_tune
from ablate.train.config import ProbeConfig, RunConfig, TrainConfig, config_hash, probe_problems

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
    if flagged := booleans_as_numbers({k: v for k, v in raw.items() if k != "grid"}, spec):
        raise StudyError(flagged, source)
    if spec.seeds is not None:  # sequential seeds: every seed up to max is a cell
        if problems := plan_problems(raw):
            raise StudyError(problems, source)
        raw = with_seed_axis(raw, spec.seeds)
        spec = StudyFile.model_validate(raw)
    out = Path(output) if output is not None else Path(spec.output or f"runs/{spec.name}")
    study = _expand(spec, raw, source, max_cells)
    if flagged := axis_booleans_as_numbers(raw.get("grid"), [c.config for c in study.cells]):
        raise StudyError(flagged, source)
    study.output_dir = out
    study.text = text
    if spec.tune is not None and (tune_errors := check_tune(spec.tune, study)):
        raise StudyError(tune_errors, source)
    if check_files:
        errors = []
        if (cache_problem := _cache_problem(study)) is not None:
            errors.append(cache_problem)
        if spec.baseline_from is not None:  # the study file it names is read now, once
            try:
                study.baseline_source = baseline_source(spec.baseline_from)
            except StudyError as e:
                errors.extend(e.errors)
        # once per data and val_tokens, not per seed (each has its own data_seed, which only
        # orders the tokens): a check stats every corpus file and hashes a tokenizer file
        for cfg in {
            json.dumps(dataclasses.asdict(c.config.data) | {"data_seed": None}, sort_keys=True): (
                c.config.data
            )
            for c in study.cells
        }.values():
            try:
                check_sources(cfg)
                # the token counts where the data is prepared already (``ablate run`` prepares
                # it, and checks them, before anything starts) in a cache that can be used
                p = None if cache_problem else already_prepared(cfg, study.data_cache())
                if p is not None:
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
        if errors:  # once each: a tokenizer is asked by its data's checks and by its model's
            raise StudyError(list(dict.fromkeys(errors)), source)
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
    """What stops the prepared-data cache from being used: an empty ``data_cache``, a file where
    its folder goes (a named pipe, a device or a symbolic link loop named as such, never opened),
    or a folder (or the nearest existing parent of a new one) this process cannot write or make a
    folder in (``/proc``, a read-only mount; tried with a folder made and removed)."""
    from ablate.data.paths import not_a_folder
    from ablate.data.prepared import CACHE_ENV, default_cache

    given = study.file.data_cache
    if given is not None and not given.strip():
        return (
            "data_cache: an empty string is not a path; give a folder for prepared data, or leave "
            f"data_cache out (then ${CACHE_ENV}, else ~/.cache/ablate/data)"
        )
    field = "data_cache" if given is not None else f"${CACHE_ENV} (the prepared-data cache)"
    named = (Path(given) if given else default_cache()).expanduser().absolute()
    # the nearest part of it that is there, as it is (not followed: a link loop cannot resolve)
    here = next((p for p in (named, *named.parents) if os.path.lexists(p)), None)
    why = None if here is None or os.path.isfile(here) else not_a_folder(here)
    if why is not None and why != "is a link to a missing file":  # that one: made when prepared
        return f"{field}: {here} {why}; give a folder for prepared data"
    cache = study.data_cache()
    there = next((p for p in (cache, *cache.parents) if p.exists()), None)
    if there is None:
        return None
    if not there.is_dir():
        return f"{field}: {there} is a file, not a folder; give a folder for prepared data"
    if not os.access(there, os.W_OK | os.X_OK):
        return f"{field}: {there} is not writable; give a folder this user can write"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ablate-probe-", dir=there))
    except OSError as e:
        return (
            f"{field}: {cache} cannot be made or written ({e.strerror} in {there}); give a "
            "folder this user can write"
        )
    return None


def _model_fits_tokenizer(rc: RunConfig) -> str | None:
    """What is wrong with ``rc``'s model for its tokenizer, checked before anything starts: a
    tokenizer file that does not load; a vocabulary (``model.vocab_size``, or a ``model.hf``
    architecture's) smaller than the tokenizer's. A hub tokenizer is checked from the Hugging Face
    cache, or not here when it is not cached yet (``preflight.check_hub``)."""
    from ablate.data import load_tokenizer
    from ablate.data.tokenizer import tokenizer_kind
    from ablate.model.hf_config import check_config

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


# --- expanding: the phases ------------------------------------------------------------------------


def _expand(spec: StudyFile, raw: dict[str, Any], source: str | None, max_cells: int) -> Study:
    """The study's cells, in phases that each return their data and their errors (raised
    together, as one ``StudyError``, before the next phase runs): every axis value checked
    (``grid_of``), the cells' axis values (``Grid.combos``), those ``exclude`` leaves (``kept``),
    each resolved into a ``RunConfig`` with the study's defaults (``_resolve_cell``), then keyed
    and labelled (``_cells``)."""
    base = spec.base.model_dump(mode="python")
    grid = _checked(grid_of(spec, base), source)
    if (too_big := grid.too_big(max_cells)) is not None:
        raise StudyError([too_big], source)
    exclude, baseline = _checked(matchers(spec, grid.axes), source)
    cells = _checked(kept(grid.combos(base), exclude), source)
    defaults = StudyDefaults.of(spec, raw, baseline)
    resolved = _checked(_resolved([_resolve_cell(v, base, defaults) for v in cells]), source)
    out, notes = _checked(_cells(resolved, grid, baseline, spec), source)
    return Study(
        file=spec, cells=out, axes=grid.axes, output_dir=Path("."), source=source, notes=notes
    )


T = TypeVar("T")


def _checked(phase: tuple[T, list[str]], source: str | None) -> T:
    """A phase's data, or its errors raised."""
    data, errors = phase
    if errors:
        raise StudyError(errors, source)
    return data


EXTEND_CONFLICT = (
    "baseline_extend: the baseline's cells set train.schedule_steps themselves; give one or the "
    "other"
)


@dataclass(frozen=True)
class StudyDefaults:
    """What the study sets on every cell's config beyond its axis values (``applied``)."""

    checkpoint_every_given: bool
    """``train.checkpoint_every`` written in the base (else a cell checkpoints at every eval)."""
    baseline: Matcher | None
    baseline_extend: float | None
    gpus: float
    """resources.gpus: device auto is cuda when above 0, else cpu."""
    workers: int
    probe: ProbeConfig | None

    @classmethod
    def of(cls, spec: StudyFile, raw: dict[str, Any], baseline: Matcher | None) -> StudyDefaults:
        raw_base = raw.get("base") or {}
        raw_train = raw_base.get("train") or {} if isinstance(raw_base, dict) else {}
        return cls(
            checkpoint_every_given="checkpoint_every" in raw_train,
            baseline=baseline,
            baseline_extend=spec.baseline_extend,
            gpus=spec.resources.gpus,
            workers=spec.resources.workers,
            probe=spec.probe,
        )

    def extends(self, vals: Mapping[str, Any]) -> bool:
        """Whether the cell of ``vals`` is a baseline cell that ``baseline_extend`` trains on."""
        return (
            bool(self.baseline_extend)
            and self.baseline is not None
            and matches(self.baseline, vals)
        )

    def applied(self, rc: RunConfig, vals: Mapping[str, Any]) -> RunConfig:
        """``rc`` with what the study sets, as a new config validated again: checkpoints at every
        evaluation unless the base sets them (resumable by default), a baseline's training
        extended (``baseline_extend``), the device from the study's resources (not from the
        machine a command runs on), the study's probes (the same for every cell; not in its
        key)."""
        train = rc.train
        if not self.checkpoint_every_given and train.checkpoint_every == 0:
            train = dataclasses.replace(train, checkpoint_every=train.eval_every)
        if self.extends(vals) and self.baseline_extend is not None:
            train = extended(train, self.baseline_extend)
        device = rc.device if rc.device != "auto" else "cuda" if self.gpus > 0 else "cpu"
        probe = self.probe if self.probe is not None else rc.probe
        return dataclasses.replace(rc, train=train, device=device, probe=probe)


@dataclass(frozen=True)
class Resolved:
    """A cell resolved: its axis values, its config, its recipe in the report's terms."""

    values: dict[str, Any]
    config: RunConfig
    recipe_axes: dict[str, str]


@dataclass(frozen=True)
class Unresolved:
    """A cell that does not resolve: its own config's errors (reported with its values), or the
    study's settings that do not fit it (reported once for the study)."""

    values: dict[str, Any]
    own: list[str] = field(default_factory=list)
    study: list[str] = field(default_factory=list)


def _resolve_cell(
    vals: dict[str, Any], base: dict[str, Any], study: StudyDefaults
) -> Resolved | Unresolved:
    """One cell's config: its axis values on the base (a combination can be impossible), with
    what the study sets (``StudyDefaults.applied``), checked against the study's settings."""
    try:
        cc = CellConfig.model_validate(with_values(base, vals))
        rc = cc.run_config()
        if study.extends(vals) and rc.train.schedule_end != rc.train.steps:
            return Unresolved(vals, study=[EXTEND_CONFLICT])
        rc = study.applied(rc, vals)
    except (ValidationError, ValueError) as e:
        msgs = pydantic_errors(e, CellConfig) if isinstance(e, ValidationError) else [str(e)]
        return Unresolved(vals, own=msgs)
    problems = []
    if rc.train.workers != study.workers:
        problems.append(
            "train.workers: set by resources.workers (processes per cell), not a grid axis"
        )
    parallel = rc.train.resolved_parallel
    if study.probe is not None and parallel != "none":
        problems.append(
            f"probe: probes run in one process (train.parallel: none), but the cells train "
            f"with {parallel} over resources.workers: {study.workers}; drop the probe section"
        )
    if study.probe is not None:
        problems.extend(probe_problems(study.probe, rc))
    if problems:
        return Unresolved(vals, study=problems)
    axes = recipe_axes(rc.recipe, cc.base_format)
    if rc.phases:  # the segments the speedup model weighs
        axes["phases"] = timeline_axes(rc.phases, rc.recipe, rc.train.steps)
    return Resolved(vals, rc, axes)


def _resolved(outcomes: list[Resolved | Unresolved]) -> tuple[list[Resolved], list[str]]:
    """The resolved cells; and the errors (at most 20, then how many more): each cell's own (once,
    marked "in every cell", when every cell fails alike: the base is wrong, not a combination),
    then the study's settings that do not fit, each once."""
    failed = [o for o in outcomes if isinstance(o, Unresolved) and o.own]
    study = list(dict.fromkeys(m for o in outcomes if isinstance(o, Unresolved) for m in o.study))
    if len(failed) == len(outcomes) > 1 and len({tuple(o.own) for o in failed}) == 1:
        own = [f"{m} (in every cell)" for m in failed[0].own]
    else:
        hint = "; drop impossible cells with `exclude`" if len(outcomes) > 1 else ""
        own = [
            f"cell {{{', '.join(f'{a}: {fmt_value(v)}' for a, v in o.values.items())}}}: {m}{hint}"
            for o in failed
            for m in o.own
        ]
    errors = own + study
    more = [f"... and {len(errors) - 20} more"] if len(errors) > 20 else []
    return [o for o in outcomes if isinstance(o, Resolved)], errors[:20] + more


def _cells(
    resolved: list[Resolved], grid: Grid, baseline: Matcher | None, spec: StudyFile
) -> tuple[tuple[list[Cell], list[str]], list[str]]:
    """((cells, notes), errors): each resolved cell keyed and labelled, duplicates run once; a
    ladder's rungs; the baseline's configuration, exactly one."""
    varying = [a for a in grid.axes if len({fmt_value(r.values[a]) for r in resolved}) > 1]
    cells: list[Cell] = []
    notes: list[str] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    for r in resolved:
        key = config_hash(r.config)
        label, config_label = _labels(r.config, r.values, varying)
        is_base = baseline is not None and matches(baseline, r.values)
        if key in seen:
            prev = cells[seen[key]]
            notes.append(f"{label} and {prev.label} resolve to the same config; it runs once")
            if is_base and not prev.baseline:
                cells[seen[key]] = dataclasses.replace(prev, baseline=True)
            continue
        seen[key] = len(cells)
        cells.append(
            Cell(
                key, label, config_label, r.values, r.config, is_base, r.recipe_axes, grid.followers
            )
        )
    label_counts = Counter(c.label for c in cells)
    dup_labels = sorted(x for x, n in label_counts.items() if n > 1)
    if dup_labels:
        errors.append(
            f"cells {', '.join(dup_labels)} differ but share a label: give each recipe variant "
            "its own label (recipe: {..., label: ...}), or an axis that tells them apart"
        )
    if spec.ladder is not None:
        cells, ladder_errors = ladder_cells(spec.ladder, cells, grid.axes)
        errors.extend(ladder_errors)
    if baseline is not None:
        configs = sorted(
            {c.ladder_config if spec.ladder else c.config_label for c in cells if c.baseline}
        )
        if not configs:
            errors.append(
                f"baseline: {fmt_value(spec.baseline)} matches no cell; the cells have "
                + _axes_summary(cells, grid.axes)
            )
        elif len(configs) > 1:
            errors.append(
                f"baseline: matches {len(configs)} configurations ({', '.join(configs)}); "
                "add axes to select exactly one (its seeds are the baseline)"
            )
    return (cells, notes), errors


def extended(train: TrainConfig, fraction: float) -> TrainConfig:
    """A baseline cell's training under ``baseline_extend: fraction``: ceil(fraction x steps)
    more steps after the schedule of ``train.steps`` (``TrainConfig.schedule_steps``)."""
    more = math.ceil(fraction * train.steps - 1e-9)
    return dataclasses.replace(train, steps=train.steps + more, schedule_steps=train.steps)


def _labels(rc: RunConfig, vals: Mapping[str, Any], varying: Sequence[str]) -> tuple[str, str]:
    """(label, config label): the recipe's short form (when a recipe axis varies, or nothing else
    does), then the other varying axes as leaf=value, then seedN."""
    parts: list[str] = []
    # the recipe's short form leaves the scale mode out (it is in the recipe's hashed dict, so its
    # label cannot change without changing keys): a varying scale mode is named like other axes
    others = [a for a in varying if (a not in RECIPE_AXES or a == "scale_mode") and a != "seed"]
    if any(a in RECIPE_AXES for a in varying) or not others:
        parts.append(rc.recipe.short())
    parts.extend(f"{_leaf(a)}={fmt_value(vals[a])}" for a in others)
    # a precision schedule no axis varies (set in base): named with its recipe and steps
    parts.extend(
        f"{p.name}:{p.recipe.short()}={p.end - p.start}"
        for p in rc.phases
        if not any(a.startswith(f"{p.name}.") for a in varying)
    )
    config_label = "/".join(parts)
    if "seed" in varying:
        return f"{config_label}/seed{rc.seed}", config_label
    return config_label, config_label


def _leaf(axis: str) -> str:
    """How a label names a dotted axis: its leaf (``lr``), but a phase's length by the phase
    (``warmup.first`` -> ``warmup``; ``warmup.recipe`` as written)."""
    section, _, leaf = axis.rpartition(".")
    if section in ("warmup", "tail"):
        return section if leaf in ("first", "last") else axis
    return leaf


def _axes_summary(cells: Sequence[Cell], axes: Sequence[str]) -> str:
    parts = []
    for a in axes:
        vals = sorted({fmt_value(c.values[a]) for c in cells})
        parts.append(f"{a} in {{{', '.join(vals)}}}")
    return "; ".join(parts) or "no axes"


def baseline_source(spec: BaselineFrom) -> BaselineSource:
    """The store ``spec`` names: a study file is read and validated (``StudyError`` naming
    ``baseline_from`` when it is missing or invalid); nothing is opened."""
    if spec.uri is not None:
        assert spec.name is not None
        return BaselineSource(spec.uri, spec.name, spec.experiment or spec.name)
    assert spec.study is not None
    if not Path(spec.study).is_file():
        raise StudyError([f"baseline_from: {spec.study}: no such study file"])
    try:
        other = load_study(spec.study, check_files=False)
    except StudyError as e:
        raise StudyError([f"baseline_from: {spec.study}: {p}" for p in e.errors]) from None
    return BaselineSource(other.tracking_uri, other.name, other.experiment)
