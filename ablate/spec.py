"""The study spec: YAML -> typed ``StudySpec`` (pydantic) -> ``Study`` with its expanded cells.

A study is a base configuration plus axes. An axis is a recipe shorthand (``fp4_gemms``,
``intervention``, ``fp4_format``, ``base_format``, ``scale_mode``, ``apply_to``, ``keep_first``,
``keep_last``), ``seed``, ``backend``, or any dotted config path (``train.lr``, ``model.preset``,
``data.data_seed``). ``grid`` is one mapping of axes (their cartesian product) or a list of them (the
union of their products); inside a grid, ``zip`` holds axes that vary together. ``exclude`` removes
cells, ``baseline`` selects the configuration others are compared with.

Each cell resolves into a full ``RunConfig``. Its **key** is a hash of that resolved config (where it
runs and where it checkpoints do not count), so YAML key order, spelling of defaults and the grid that
produced it do not matter, and a changed config gets a new key. Its **label** reads like the recipe
(``mxfp4[fprop,dgrad,wgrad]+dht16/fp8``) plus the other axes that vary (``lr=0.001``) and the seed.

Everything is checked here, before Ray starts or anything is written: unknown keys and axes, wrong
types, misspelled interventions, impossible combinations, an empty grid, a baseline or exclusion that
matches no cell, missing data files. ``SpecError`` carries one message per problem, each starting
with the YAML path (``grid.intervention[2]``) and naming the allowed values.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from backends.recipe import GEMMS, Recipe, intervention_label, parse_intervention
from backends.registry import available_backends

from .report.speedup import SpeedupSpec
from .train.config import RunConfig, TrainConfig
from .train.data import DataConfig, check_sources
from .train.loop import config_hash
from .train.model import ModelConfig
from .tune_space import TuneSpec, check_tune

Gemm = Literal["fprop", "dgrad", "wgrad"]
RECIPE_AXES = (
    "fp4_gemms",
    "intervention",
    "fp4_format",
    "base_format",
    "scale_mode",
    "apply_to",
    "keep_first",
    "keep_last",
)
TOP_AXES = (*RECIPE_AXES, "seed", "backend")
SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
LIST_AXES = ("fp4_gemms", "apply_to")  # axes whose single value is itself a list


class SpecError(ValueError):
    """A study that cannot run; ``errors`` holds one ``"yaml.path: what is wrong"`` line each."""

    def __init__(self, errors: Sequence[str], source: str | None = None) -> None:
        self.errors = list(errors)
        self.source = source
        head = f"{source}: " if source else ""
        n = len(self.errors)
        super().__init__(
            f"{head}{n} problem{'s' if n > 1 else ''} in the study:\n  " + "\n  ".join(self.errors)
        )


# --- the schema ---------------------------------------------------------------------------------


class CellConfig(BaseModel):
    """What one cell trains: the trainer's sections plus the recipe in the study's vocabulary."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    backend: str = "emulated"
    """GEMM backend: emulated (exact emulation, any device) or native (hardware FP4/FP8 GEMMs)."""
    seed: int = Field(default=0, ge=0)
    """Model initialization and stochastic-rounding seed (data order: data.data_seed)."""
    device: str = "auto"
    """cpu, cuda, cuda:N or auto; not part of a cell's key."""
    fp4_gemms: list[Gemm] = Field(default_factory=list)
    """GEMMs of every block linear that run in FP4: any of fprop, dgrad, wgrad."""
    intervention: str = "none"
    """none, sr, rht[N], dht[N], fht[N] or sr+<hadamard>; applied to the FP4 GEMMs (or apply_to)."""
    fp4_format: Literal["mxfp4", "nvfp4"] = "mxfp4"
    base_format: Literal["bf16", "fp8", "mxfp8"] = "bf16"
    """Format of the GEMMs that are not FP4."""
    scale_mode: Literal["floor", "ceil", "even", "rceil"] = "floor"
    """MX shared-exponent rule (OCP: floor)."""
    apply_to: list[Gemm] | None = None
    """GEMMs the intervention acts on (default: the FP4 GEMMs)."""
    keep_first: int = Field(default=0, ge=0)
    """First N transformer blocks stay in high precision."""
    keep_last: int = Field(default=0, ge=0)
    """Last N transformer blocks stay in high precision."""

    @field_validator("fp4_gemms", "apply_to")
    @classmethod
    def _canonical_gemms(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        if len(set(v)) != len(v):
            raise ValueError(f"a GEMM is listed twice in {v}")
        return [g for g in GEMMS if g in v]

    @field_validator("intervention")
    @classmethod
    def _known_intervention(cls, v: str) -> str:
        try:
            parse_intervention(v)
        except ValueError as e:
            raise ValueError(str(e).removeprefix("intervention: ")) from None
        return v

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        allowed = available_backends()
        if v not in allowed:
            raise ValueError(f"unknown backend {v!r}; allowed: {', '.join(allowed)}")
        return v

    def run_config(self) -> RunConfig:
        recipe = Recipe.from_shorthand(
            self.fp4_gemms,
            self.intervention,
            fp4_format=self.fp4_format,
            base=self.base_format,
            scale_mode=self.scale_mode,
            apply_to=self.apply_to,
            keep_first=self.keep_first,
            keep_last=self.keep_last,
        )
        return RunConfig(
            model=self.model,
            data=self.data,
            train=self.train,
            recipe=recipe,
            backend=self.backend,
            seed=self.seed,
            device=self.device,
        )


class Target(BaseModel):
    """The perplexity a run must reach: absolute, or derived from the baseline's."""

    model_config = ConfigDict(extra="forbid")

    val_ppl: float | None = Field(default=None, gt=1)
    val_loss: float | None = Field(default=None, gt=0)
    from_baseline: Literal["final", "best"] | None = None
    """Mean final (or best) validation perplexity of the baseline's seeds..."""
    tolerance: float = Field(default=0.0, ge=0)
    """...times (1 + tolerance)."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Target:
        given = [
            n for n in ("val_ppl", "val_loss", "from_baseline") if getattr(self, n) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of val_ppl, val_loss, from_baseline (got {given or 'none'})"
            )
        if self.tolerance and self.from_baseline is None:
            raise ValueError("tolerance applies to from_baseline only")
        return self


class Resources(BaseModel):
    """What each cell needs from a Ray worker."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(default=1, gt=0)
    """CPU cores per cell (also its torch thread count, rounded down, at least 1)."""
    gpus: float = Field(default=0, ge=0)
    max_concurrent: int | None = Field(default=None, ge=1)
    """At most this many cells at once (default: as many as the cluster fits)."""
    max_retries: int = Field(default=3, ge=0)
    """Retries of a cell whose worker died (it resumes from its checkpoint)."""


class Tracking(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uri: str | None = None
    """MLflow tracking URI; default: a SQLite database in the study's output folder."""
    experiment: str | None = None
    """MLflow experiment name; default: the study's name."""


class StudySpec(BaseModel):
    """A study as written in YAML."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """Letters, digits, '_', '.', '-': names the output folder and the MLflow experiment."""
    description: str = ""
    base: CellConfig = Field(default_factory=CellConfig)
    grid: dict[str, Any] | list[dict[str, Any]]
    """Axis -> list of values (a product), or a list of such mappings (a union of products).
    Inside one, ``zip: {axis: [...], ...}`` holds axes of equal length that vary together."""
    exclude: list[dict[str, Any]] = Field(default_factory=list)
    """Cells to drop: axis -> value (or a list of values, any of which matches)."""
    baseline: dict[str, Any] | None = None
    """Axis -> value selecting the baseline configuration (its seeds)."""
    target: Target | None = None
    """Default: from_baseline final when a baseline is set."""
    resources: Resources = Field(default_factory=Resources)
    tracking: Tracking = Field(default_factory=Tracking)
    output: str | None = None
    """Output folder (checkpoints, MLflow store); default runs/<name> in the current directory."""
    speedup: SpeedupSpec = Field(default_factory=SpeedupSpec)
    """How the report projects step throughput where it was not measured on native GEMMs."""
    tune: TuneSpec | None = None
    """Optuna search over config paths, per group of cells (``ablate tune``; see ablate.tune_space)."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", v):
            raise ValueError(
                f"{v!r} is not a usable study name; use letters, digits, '_', '.' and '-' "
                "(at most 100, starting with a letter or digit): it names the output folder and "
                "the MLflow experiment"
            )
        return v

    @field_validator("grid")
    @classmethod
    def _nonempty(cls, v: dict[str, Any] | list[dict[str, Any]]) -> Any:
        grids = v if isinstance(v, list) else [v]
        if not grids or any(not g for g in grids):
            raise ValueError(
                "empty grid; a study needs at least one axis with values, e.g. {seed: [0, 1]}"
            )
        return v


# --- cells -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    key: str
    """Hash of the resolved config (see module docstring)."""
    label: str
    """Readable name: the recipe, other varying axes, the seed."""
    config_label: str
    """The label without the seed: cells with equal config_label differ only by seed."""
    values: Mapping[str, Any]
    """Value of every axis of the study in this cell (resolved, canonical)."""
    config: RunConfig
    baseline: bool = False
    recipe_axes: Mapping[str, Any] = field(default_factory=dict)
    """The recipe in the study's vocabulary: fp4_gemms, intervention (canonical, e.g. dht16),
    fp4_format, base_format."""

    @property
    def seed(self) -> int:
        return self.config.seed

    def tags(self) -> dict[str, str]:
        """What tracking records about the cell besides its params."""
        r = self.config.recipe
        fp4 = [g for g in GEMMS if r.gemm(g).is_fp4]
        out = {
            "ablate.config": self.config_label,
            "ablate.seed": str(self.seed),
            "ablate.baseline": str(self.baseline).lower(),
            "ablate.recipe": r.short(),
            "ablate.fp4_gemms": "+".join(fp4),
            "ablate.backend": self.config.backend,
            "ablate.tokens_per_step": str(self.config.train.tokens_per_step),
        }
        for k in ("intervention", "fp4_format", "base_format"):
            if k in self.recipe_axes:
                out[f"ablate.{k}"] = str(self.recipe_axes[k])
        for axis, v in self.values.items():
            out[f"ablate.axis.{axis}"] = fmt_value(v)
        return out


@dataclass
class Study:
    spec: StudySpec
    cells: list[Cell]
    axes: list[str]
    """Every axis of the study, in order of first appearance."""
    output_dir: Path
    text: str = ""
    """The YAML as written (recorded with the study's parent run)."""
    source: str | None = None
    notes: list[str] = field(default_factory=list)
    """Things the user should know that are not errors (duplicate cells merged, defaults taken)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tracking_uri(self) -> str:
        if self.spec.tracking.uri:
            return self.spec.tracking.uri
        return "sqlite:///" + str((self.output_dir / "mlflow.db").resolve())

    @property
    def experiment(self) -> str:
        return self.spec.tracking.experiment or self.spec.name

    @property
    def baseline_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.baseline]

    @property
    def target(self) -> Target | None:
        if self.spec.target is not None:
            return self.spec.target
        if self.spec.baseline is not None:
            return Target(from_baseline="final")
        return None

    def checkpoint_dir(self, cell: Cell) -> Path:
        return self.output_dir / "cells" / cell.key


# --- loading ---------------------------------------------------------------------------------------


def load_study(
    path: str | Path, *, output: str | Path | None = None, check_files: bool = True
) -> Study:
    """Read, validate and expand a study file; raises ``SpecError`` listing every problem."""
    p = Path(path)
    if not p.is_file():
        raise SpecError([f"{path}: no such study file"])
    text = p.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError([f"not valid YAML: {e}"], str(path)) from None
    return parse_study(raw, text=text, source=str(path), output=output, check_files=check_files)


def parse_study(
    raw: Any,
    *,
    text: str = "",
    source: str | None = None,
    output: str | Path | None = None,
    check_files: bool = True,
) -> Study:
    """Validate and expand an already-parsed study (a mapping, as from YAML)."""
    if not isinstance(raw, dict):
        raise SpecError(
            [f"the study must be a mapping (name:, base:, grid:, ...), got {type(raw).__name__}"],
            source,
        )
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(pydantic_errors(e, StudySpec), source) from None
    out = Path(output) if output is not None else Path(spec.output or f"runs/{spec.name}")
    study = _expand(spec, raw, source)
    study.output_dir = out
    study.text = text
    if spec.tune is not None and (tune_errors := check_tune(spec.tune, study)):
        raise SpecError(tune_errors, source)
    if check_files:
        errors = []
        for cfg in {c.config.data.path: c.config.data for c in study.cells}.values():
            try:
                check_sources(cfg)
            except (FileNotFoundError, ValueError) as err:
                varied = any(a.startswith("data.") for a in study.axes)
                errors.append(str(err) if varied else f"base.{err}")
        if errors:
            raise SpecError(errors, source)
    return study


def _expand(spec: StudySpec, raw: dict[str, Any], source: str | None) -> Study:
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
    per_grid: list[list[list[tuple[tuple[str, Any], ...]]]] = []
    for g, gpath in zip(grids, grid_paths, strict=True):
        factors: list[list[tuple[tuple[str, Any], ...]]] = []
        for name, values in g.items():
            if name == "zip":
                groups = values if isinstance(values, list) else [values]
                for k, group in enumerate(groups):
                    zpath = f"{gpath}.zip" + (f"[{k}]" if isinstance(values, list) else "")
                    factors.append(_zip_factor(group, zpath, base, errors, axes))
            else:
                factors.append(
                    [(o,) for o in _axis_options(name, values, f"{gpath}.{name}", base, errors)]
                )
                if name not in axes and not check_axis_name(name):
                    axes.append(name)
        per_grid.append(factors)
    if errors:
        raise SpecError(errors, source)

    # 2. cells: the product of each grid, the union over grids; every axis gets a value (the
    #    base's where a grid does not set it), so exclude/baseline can name any axis
    combos: list[dict[str, Any]] = []
    for factors in per_grid:
        for choice in itertools.product(*factors):
            vals = {a: _get(base, a) for a in axes}
            vals.update({a: v for option in choice for (a, v) in option})
            combos.append(vals)

    # 3. exclusions and the baseline
    exclude = [_match_spec(e, f"exclude[{i}]", axes, errors) for i, e in enumerate(spec.exclude)]
    baseline = (
        _match_spec(spec.baseline, "baseline", axes, errors) if spec.baseline is not None else None
    )
    if errors:
        raise SpecError(errors, source)
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
        raise SpecError(errors, source)

    # 4. resolve every cell into a RunConfig (combinations can be impossible)
    resolved: list[tuple[dict[str, Any], RunConfig, dict[str, Any]]] = []
    for vals in kept:
        try:
            cc = CellConfig.model_validate(with_values(base, vals))
            rc = cc.run_config()
        except (ValidationError, ValueError) as e:
            what = ", ".join(f"{a}: {fmt_value(v)}" for a, v in vals.items())
            msgs = pydantic_errors(e, CellConfig) if isinstance(e, ValidationError) else [str(e)]
            errors.extend(
                f"cell {{{what}}}: {m}; drop impossible cells with `exclude`" for m in msgs
            )
            continue
        if "checkpoint_every" not in raw_train and rc.train.checkpoint_every == 0:
            rc.train.checkpoint_every = rc.train.eval_every  # resumable by default
        recipe_axes = {
            "fp4_gemms": "+".join(cc.fp4_gemms),
            "intervention": intervention_label(*parse_intervention(cc.intervention)),
            "fp4_format": cc.fp4_format,
            "base_format": cc.base_format,
        }
        resolved.append((vals, rc, recipe_axes))
    if errors:
        more = [f"... and {len(errors) - 20} more"] if len(errors) > 20 else []
        raise SpecError(errors[:20] + more, source)

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
        cells.append(Cell(key, label, config_label, vals, rc, is_base, recipe_axes))
    labels = [c.label for c in cells]
    dup_labels = sorted({x for x in labels if labels.count(x) > 1})
    if dup_labels:
        errors.append(
            f"cells {', '.join(dup_labels)} differ in ways no axis names (their labels collide); "
            "this should not happen, please report it"
        )

    if baseline is not None:
        configs = sorted({c.config_label for c in cells if c.baseline})
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
        raise SpecError(errors, source)
    return Study(
        spec=spec, cells=cells, axes=axes, output_dir=Path("."), source=source, notes=notes
    )


def _zip_factor(
    group: Any, zpath: str, base: dict[str, Any], errors: list[str], axes: list[str]
) -> list[tuple[tuple[str, Any], ...]]:
    if not isinstance(group, dict) or not group:
        errors.append(f"{zpath}: must map axes to equal-length lists, e.g. {{train.lr: [..], ...}}")
        return []
    cols: list[list[tuple[str, Any]]] = []
    for name, values in group.items():
        cols.append(_axis_options(name, values, f"{zpath}.{name}", base, errors))
        if name not in axes and not check_axis_name(name):
            axes.append(name)
    lengths = {len(c) for c in cols}
    if len(lengths) > 1:
        sizes = ", ".join(f"{n}: {len(c)}" for n, c in zip(group, cols, strict=True))
        errors.append(f"{zpath}: zipped axes must have equal lengths ({sizes})")
        return []
    return list(zip(*cols, strict=True))


def _axis_options(
    name: str, values: Any, path: str, base: dict[str, Any], errors: list[str]
) -> list[tuple[str, Any]]:
    """[(axis, canonical value)] for one axis, each value validated on top of the base."""
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
        try:
            cfg = CellConfig.model_validate(with_values(base, {name: v}))
        except ValidationError as e:
            for m in pydantic_errors(e, CellConfig):
                rest = m[len(name) :] if m.startswith(name) and m[len(name)] in ":[" else f": {m}"
                errors.append(f"{path}[{i}]{rest}")
            continue
        out.append((name, _get(cfg.model_dump(mode="python"), name)))
    return out


def check_axis_name(name: str) -> str | None:
    allowed = [*TOP_AXES, *(f"{s}.<field>" for s in SECTIONS)]
    if "." not in name:
        if name in TOP_AXES:
            return None
        if name in SECTIONS:
            return (
                f"{name!r} is a section; vary one of its fields (e.g. {name}.{_first_field(name)})"
            )
        hint = _did_you_mean(name, [*TOP_AXES, *_all_dotted()])
        return f"unknown axis {name!r}{hint}; allowed: {', '.join(allowed)}"
    section, _, fname = name.partition(".")
    if section not in SECTIONS:
        hint = _did_you_mean(name, _all_dotted())
        return f"unknown axis {name!r}{hint}; allowed: {', '.join(allowed)}"
    names = [f.name for f in dataclasses.fields(SECTIONS[section])]
    if fname not in names:
        hint = _did_you_mean(fname, names)
        return f"{section} has no field {fname!r}{hint}; allowed: {', '.join(names)}"
    return None


def _first_field(section: str) -> str:
    return dataclasses.fields(SECTIONS[section])[0].name


def _all_dotted() -> list[str]:
    return [f"{s}.{f.name}" for s, t in SECTIONS.items() for f in dataclasses.fields(t)]


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def with_values(base: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with dotted-path overrides."""
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for name, v in values.items():
        if "." in name:
            section, _, fname = name.partition(".")
            d.setdefault(section, {})[fname] = v
        else:
            d[name] = v
    return d


def _get(d: Mapping[str, Any], name: str) -> Any:
    if "." in name:
        section, _, fname = name.partition(".")
        return d[section][fname]
    return d[name]


def fmt_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ",".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {fmt_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _labels(rc: RunConfig, vals: Mapping[str, Any], varying: Sequence[str]) -> tuple[str, str]:
    """(label, config label): the recipe's short form (when a recipe axis varies, or nothing else
    does), then the other varying axes as leaf=value, then seedN."""
    parts: list[str] = []
    others = [a for a in varying if a not in RECIPE_AXES and a != "seed"]
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


# --- error messages ---------------------------------------------------------------------------------


def pydantic_errors(e: ValidationError, root: type) -> list[str]:
    out = []
    for err in e.errors():
        loc = [x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-"))]
        where = _yaml_path(loc)
        msg = err["msg"]
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            allowed = _allowed_keys(root, loc[:-1])
            hint = _did_you_mean(str(loc[-1]), allowed) if allowed else ""
            msg = f"unknown key{hint}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            # the trainer's messages start with their own dotted path (train.grad_accum: ...)
            head, sep, rest = msg.partition(": ")
            if sep and " " not in head and "." in head:
                parent = list(loc)
                if parent and parent[-1] == head.split(".")[0]:
                    parent = parent[:-1]
                where = _yaml_path([*parent, head])
                msg = rest
        elif err["type"] == "missing":
            msg = "required"
        out.append(f"{where}: {msg}" if where else msg)
    return out


def _yaml_path(loc: Sequence[Any]) -> str:
    s = ""
    for x in loc:
        if isinstance(x, int):
            s += f"[{x}]"
        else:
            s += f".{x}" if s else str(x)
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


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a study file, for editors."""
    return StudySpec.model_json_schema()
