"""The study schema: pydantic models of a study file (``StudyFile``), of one cell's configuration in
the study's vocabulary (``CellConfig``: the trainer's sections plus the recipe: the shorthands, a
named recipe or the explicit per-GEMM form of ``spec.recipe``) and of the ``tune:`` section
(``TuneSection``: what ``ablate tune`` searches; its checks are in ``spec.tune``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from ablate.data import DataConfig
from ablate.model import ModelConfig
from ablate.study.baseline_from import BaselineFrom
from ablate.study.ladder import LadderSection
from ablate.study.override import RecipeOverride
from ablate.study.phases import Tail, Warmup, phases
from ablate.study.recipe import (
    ExplicitRecipe,
    LayerSelection,
    check_recipe_name,
    explicit_recipe,
    select,
)
from ablate.study.schedules import schedule_keys
from ablate.study.seeds import SeedPlan
from ablate.study.speedup import SpeedupSection
from ablate.train.config import ProbeConfig, RunConfig, TrainConfig
from backends.gemm import available_backends
from backends.recipes import GEMMS, Gemm, HadamardSpec, Recipe
from backends.recipes.intervention import NONE, Intervention, parse

RECIPE_AXES = (
    "fp4_gemms",
    "intervention",
    "fp4_format",
    "base_format",
    "scale_mode",
    "apply_to",
    "keep_first",
    "keep_last",
    "recipe",
    "gemms",
    "layers",
    "schedule",
)
SHORTHANDS = ("fp4_gemms", "intervention", "apply_to")
"""The recipe shorthands that do not combine with a named (``recipe``) or explicit (``gemms``) one."""
TOP_AXES = (*RECIPE_AXES, "seed", "backend")
SECTIONS: dict[str, type] = {
    "model": ModelConfig, "data": DataConfig, "train": TrainConfig, "warmup": Warmup, "tail": Tail
}  # fmt: skip
LIST_AXES = ("fp4_gemms", "apply_to")  # axes whose single value is itself a list
MAX_EXTEND = 4.0
"""The most ``baseline_extend`` allows: a baseline trained 5x the study's budget."""


@dataclass(frozen=True, slots=True)
class WrittenIntervention:
    """A cell's ``intervention``: the word as the study writes it (``text``, its axis value, what
    the config dumps) and its meaning, parsed once when the study is validated (``value``, what
    ``Recipe.from_shorthand`` builds)."""

    text: str
    value: Intervention

    @classmethod
    def of(cls, v: Any) -> WrittenIntervention:
        """Validate a written intervention (or pass one through); the message names what is
        allowed (unknown 'rth'; allowed: none, sr, ...), the Hadamard size checked too."""
        if isinstance(v, cls):
            return v
        if not isinstance(v, str):
            raise ValueError(
                f"{str(v)[:40]} is not an intervention; give one word such as none, sr, rht64, "
                "dht or sr+rht"
            )
        try:
            iv = parse(v, shorthand=True)
            if iv.hadamard is not None:
                HadamardSpec.of(iv.hadamard)  # its size: 16, 32, 64, 128 or 256
        except ValueError as e:  # at its path: intervention: unknown 'rth'; ...
            raise ValueError(str(e).removeprefix("intervention: ")) from None
        return cls(v, iv)


InterventionWord = Annotated[
    WrittenIntervention,
    PlainValidator(WrittenIntervention.of),
    PlainSerializer(lambda w: w.text, return_type=str),
    WithJsonSchema({"type": "string"}),
]


class CellConfig(BaseModel):
    """What one cell trains: the trainer's sections plus the recipe in the study's vocabulary."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    backend: str = "emulated"
    """GEMM backend: emulated (exact emulation, any device) or native (hardware FP4/FP8 GEMMs)."""

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Initial weights, stochastic-rounding and batch-order seed (unless data.data_seed is set)."""
    device: str = "auto"
    """cpu, cuda, cuda:N or auto: cuda when resources.gpus > 0, else cpu. The kind (cpu or cuda)
    is part of a cell's key, which GPU is not."""
    fp4_gemms: list[Gemm] = Field(default_factory=list)
    """GEMMs of every block linear that run in FP4: any of fprop, dgrad, wgrad."""
    intervention: InterventionWord = Field(
        default=WrittenIntervention("none", NONE), json_schema_extra={"default": "none"}
    )
    """none, sr, rht[N], dht[N], fht[N] or sr+<hadamard>; applied to the FP4 GEMMs (or apply_to).
    Parsed once, here (``backends.recipes.intervention``); dumped as written."""
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
    recipe: str | RecipeOverride | None = None
    """A named recipe instead of the shorthands: nvidia_nvfp4, tseng_mxfp4, amd_mxfp4_h16,
    quartet, four_over_six, nvidia_nvfp4_4over6, quartet_ii, tetrajet_v2 (backends.recipes.named;
    ``ablate recipe NAME`` shows one); or a variant of one, {name: NAME, fprop|dgrad|wgrad:
    {changed keys}} (ablate.study.override)."""
    gemms: ExplicitRecipe | None = None
    """The explicit recipe instead of the shorthands: per GEMM (fprop, dgrad, wgrad) and operand
    (x, w, dy) format, rounding, prescale, block, and a Hadamard transform (ablate.study.recipe)."""
    layers: LayerSelection | None = None
    """Which block linears follow the recipe: types (attention, mlp) and block indices (negative:
    from the end); default all. The rest stay in high precision, as keep_first/keep_last blocks."""
    warmup: Warmup | None = None
    """The first steps under another recipe: {recipe: fp8, first: 0.05} (ablate.study.phases)."""
    tail: Tail | None = None
    """The last steps under another recipe: {recipe: bf16, gemms: [fprop], last: 0.1}."""
    schedule: str | None = None
    """A named precision schedule: its recipe, warmup and tail (ablate.study.schedules)."""
    _schedule = model_validator(mode="before")(schedule_keys)

    @field_validator("recipe", mode="before")
    @classmethod
    def _named(cls, v: Any) -> Any:
        if isinstance(v, dict):  # a variant: its first problem at its path below recipe
            return RecipeOverride.parse(v)
        return check_recipe_name(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _one_recipe(self) -> CellConfig:
        """At most one spelling of the recipe; a named or explicit one builds; the layer selection
        fits the model (messages start with their path: layers.blocks[1]: ...)."""
        given = [k for k in ("recipe", "gemms") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(
                "gemms: give a named recipe (recipe) or an explicit one (gemms), not both"
            )
        if given:
            shorthands = [
                k
                for k in SHORTHANDS
                if (self.intervention.text if k == "intervention" else getattr(self, k))
                not in (None, [], "none")
            ]
            if shorthands:
                kind = "a named" if given[0] == "recipe" else "an explicit"
                raise ValueError(
                    f"{given[0]}: {kind} recipe does not combine with the shorthand "
                    f"{', '.join(shorthands)}; it sets every GEMM itself (drop "
                    f"{', '.join(shorthands)}, or exclude such cells)"
                )
            self.recipe_object()  # (a shorthand's impossible cells are reported per cell)
        if self.layers is not None and self.layers.blocks is not None:
            n_layers = self.model.resolved().n_layers
            if n_layers is not None:
                Recipe(blocks=tuple(self.layers.blocks)).check_blocks(n_layers)
        return self

    @field_validator("fp4_gemms", "apply_to")
    @classmethod
    def _canonical_gemms(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        if len(set(v)) != len(v):
            raise ValueError(f"a GEMM is listed twice in {v}")
        return [g for g in GEMMS if g in v]

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        allowed = available_backends()
        if v not in allowed:
            raise ValueError(f"unknown backend {v!r}; allowed: {', '.join(allowed)}")
        return v

    def recipe_object(self) -> Recipe:
        """The cell's ``backends.Recipe``, from whichever spelling it uses."""
        if isinstance(self.recipe, RecipeOverride):
            return select(
                self.recipe.build(self.base_format),
                keep_first=self.keep_first,
                keep_last=self.keep_last,
                layers=self.layers,
            )
        if self.recipe is not None or self.gemms is not None:
            return explicit_recipe(
                self.recipe,
                self.gemms,
                self.base_format,
                keep_first=self.keep_first,
                keep_last=self.keep_last,
                layers=self.layers,
            )
        r = Recipe.from_shorthand(
            self.fp4_gemms,
            self.intervention.value,
            fp4_format=self.fp4_format,
            base=self.base_format,
            scale_mode=self.scale_mode,
            apply_to=self.apply_to,
            keep_first=0 if self.layers else self.keep_first,
            keep_last=0 if self.layers else self.keep_last,
        )
        if self.layers is None:  # the shorthand's recipe as ever (cell keys depend on it)
            return r
        return select(r, keep_first=self.keep_first, keep_last=self.keep_last, layers=self.layers)

    def run_config(self) -> RunConfig:
        own, steps = self.recipe_object(), self.train.steps
        return RunConfig(
            model=self.model,
            data=self.data,
            train=self.train,
            recipe=own,
            phases=phases(self.warmup, self.tail, own, self.base_format, steps),
            backend=self.backend,
            seed=self.seed,
            device=self.device,
        )


# --- the tune: section -------------------------------------------------------------------------

Objective = Literal["final_val_loss", "tokens_to_target"]
ParamKind = Literal["float", "int", "categorical"]


class SearchParam(BaseModel):
    """One searched config path: a range (low, high, log/step) or a list of choices."""

    model_config = ConfigDict(extra="forbid")

    type: ParamKind | None = None
    """float, int or categorical; default: categorical with choices, else the config field's type."""
    low: float | None = None
    high: float | None = None
    log: bool = False
    """Sample on a log scale (needs low > 0): learning rates."""
    step: float | None = None
    """Discretize the range in steps of this size (not with log)."""
    choices: list[Any] | None = None


class SamplerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["tpe", "random"] = "tpe"
    seed: int = 0
    """Seed of the search; a continued search is reseeded with seed + trials so far."""
    startup_trials: int = Field(default=10, ge=0)
    """TPE: random trials before the model of good and bad parameters takes over."""


class PrunerOptions(BaseModel):
    """Stops trials that are clearly failing, judged on validation loss within one search only."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["threshold", "median", "patient"]
    """threshold: val_loss above max_val_loss (or NaN); median: worse than the median of earlier
    trials at the same step; patient: no improvement by min_delta for ``patience`` evaluations."""
    max_val_loss: float | None = None
    """threshold: the ceiling."""
    startup_trials: int = Field(default=3, ge=0)
    """median: trials that finish before it prunes anything."""
    patience: int = Field(default=3, ge=1)
    """patient: evaluations without improvement before pruning."""
    min_delta: float = Field(default=0.0, ge=0)
    """patient: what counts as an improvement."""
    min_step: int = Field(default=0, ge=0)
    """Never prune before this training step."""


class TuneSection(BaseModel):
    """An Optuna search over the study's search space (``ablate tune``)."""

    model_config = ConfigDict(extra="forbid")

    space: dict[str, SearchParam]
    """Config path -> range or choices."""
    per: list[str] = Field(default_factory=list)
    """Axes (or ``config``) whose value combinations get one search each."""
    objective: Objective = "final_val_loss"
    """final_val_loss, or tokens_to_target (the study's target; a trial that never reaches it
    scores NOT_REACHED_FACTOR x its training tokens)."""
    direction: Literal["minimize", "maximize"] = "minimize"
    trials: int = Field(default=20, ge=1)
    """Trials per search, counting those done by earlier invocations."""
    parallelism: int = Field(default=1, ge=1)
    """Trials in flight per search (the local executor runs one at a time)."""
    sampler: SamplerOptions = Field(default_factory=SamplerOptions)
    pruner: PrunerOptions | None = None
    enqueue: list[dict[str, Any]] = Field(default_factory=list)
    """Parameter sets each new search tries first (e.g. the current defaults)."""


# --- the study -------------------------------------------------------------------------------------


MAX_TARGET_LOSS = 50.0
"""A validation loss a target may name: below this (perplexity e^50 ~ 5e21, beyond any
vocabulary's uniform 12-13 nats); above it, or infinite, the report could compare nothing."""
MAX_TARGET_PPL = math.exp(MAX_TARGET_LOSS)


class Target(BaseModel):
    """The perplexity a run must reach: absolute, or derived from the baseline's finished seeds
    (the rule is ``ablate.targets.target_ppl``)."""

    model_config = ConfigDict(extra="forbid")

    val_ppl: float | None = Field(default=None, gt=1, lt=MAX_TARGET_PPL, strict=True)
    val_loss: float | None = Field(default=None, gt=0, lt=MAX_TARGET_LOSS, strict=True)
    from_baseline: Literal["final", "best", "slowest", "median"] | None = None
    """slowest: the highest perplexity every baseline seed reaches by ``at`` of its budget (the
    default target); median: the median over the baseline's seeds of the perplexity each reaches
    by ``at`` of its budget; final/best: the mean final/best perplexity of the baseline's seeds..."""
    tolerance: float = Field(default=0.0, ge=0)
    """...times (1 + tolerance)."""
    at: float | None = Field(default=None, gt=0, le=1)
    """For from_baseline: slowest or median, the fraction of the budget (default 0.75):
    configurations that cost up to 1/at - 1 more tokens (+33%) can still show their cost."""

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
        if self.at is not None and self.from_baseline not in ("slowest", "median"):
            raise ValueError("at applies to from_baseline: slowest or median only")
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
    workers: int = Field(default=1, ge=1)
    """Processes per cell, each with the cpus and gpus above: above 1, a cell trains data
    parallel (``train.parallel``: ddp or fsdp) through Ray Train, each worker on
    train.batch_size / workers sequences of every step."""


class Tracking(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uri: str | None = None
    """MLflow tracking URI; default: a SQLite database in the study's output folder."""
    experiment: str | None = None
    """MLflow experiment name; default: the study's name."""


class StudyFile(BaseModel):
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
    baseline_extend: float | None = None
    """The baseline's cells train on past the study's budget by this fraction of train.steps
    (0.5: 1.5x the steps): the same schedule up to the budget, so their curves up to it are an
    ordinary cell's bit for bit, then on at the schedule's final learning rate. Every
    configuration's final loss then lies on the baseline's curves, which the equal-loss ratio
    reads; tokens to target and a target derived from the baseline use the part up to the budget.
    In (0, 4]; the baseline's cells get their own keys."""
    baseline_from: BaselineFrom | None = None
    """A study or store whose runs of the baseline's keys are its seeds (``study.baseline_from``)."""
    target: Target | None = None
    """Default, when a baseline is set: from_baseline slowest at 0.75 (every baseline seed reaches
    it by 75% of its budget)."""
    seeds: SeedPlan | None = None
    """Sequential seeds instead of a seed axis: waves until each comparison is decided."""
    resources: Resources = Field(default_factory=Resources)
    tracking: Tracking = Field(default_factory=Tracking)
    output: str | None = None
    """Output folder (checkpoints, MLflow store); default runs/<name> in the current directory."""
    data_cache: str | None = None
    """Folder of prepared data (each data configuration tokenized once, memory-mapped by every
    cell): default $ABLATE_DATA_CACHE, else ~/.cache/ablate/data. On a cluster, a folder that
    every node sees (else each node prepares its own copy once)."""
    speedup: SpeedupSection = Field(default_factory=SpeedupSection)
    """How the report projects step throughput where it was not measured on native GEMMs."""
    tune: TuneSection | None = None
    """Optuna search over config paths, per group of cells (``ablate tune``; see ablate.study.tune)."""
    ladder: LadderSection | None = None
    """A scaling ladder: compare rung by rung (size x budget), fit Quartet's law and predict each
    configuration's token ratio at ``predict`` (``ablate.study.ladder``; docs/ladders.md)."""
    probe: ProbeConfig | None = None
    """Gradient-fidelity probes of every cell during training (off when absent; see
    ablate.train.probe): every, batches, gemms, layers, repeats, window. Not part of a cell's key:
    adding probes to a study reruns nothing (``ablate probe`` probes saved checkpoints)."""

    @model_validator(mode="before")
    @classmethod
    def _workers_into_train(cls, v: Any) -> Any:
        """``resources.workers`` is the run's ``train.workers`` (its batch split and its ranks'
        random streams depend on it): copied there, never written there by hand."""
        if not isinstance(v, dict):
            return v
        base, res = v.get("base"), v.get("resources")
        train = base.get("train") if isinstance(base, dict) else None
        workers = res.get("workers", 1) if isinstance(res, dict) else 1
        if isinstance(train, dict) and train.get("workers", workers) != workers:
            # a resolved base (config.json, a dumped spec) carries it, equal to resources'
            raise ValueError(
                f"base.train.workers: {train['workers']}, but resources.workers is {workers}: "
                "set by resources.workers (processes per cell); write it there"
            )
        if isinstance(workers, int) and not isinstance(workers, bool) and workers > 1:
            base = dict(base) if isinstance(base, dict) else {}
            base["train"] = {**(train if isinstance(train, dict) else {}), "workers": workers}
            v = {**v, "base": base}
        return v

    @field_validator("baseline_extend", mode="before")
    @classmethod
    def _extend_range(cls, v: Any) -> Any:
        """One message with the field, the allowed range and what it means."""
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= MAX_EXTEND
        if v is not None and not ok:
            raise ValueError(
                f"{str(v)[:40]} is not in (0, {MAX_EXTEND:g}]: the fraction of "
                "train.steps the baseline's cells train past the budget (0.5: 1.5x the steps); "
                "leave it out for a baseline trained like every other cell"
            )
        return v

    @model_validator(mode="after")
    def _ladder_needs_a_baseline(self) -> StudyFile:
        if self.ladder is not None and self.baseline is None:
            raise ValueError(
                "ladder: compares each rung's configurations with its baseline, but the study "
                "has no baseline; add `baseline: {axis: value}`"
            )
        if self.ladder is not None and self.baseline_extend is not None:
            raise ValueError(
                "ladder: a ladder reads each budget as trained to it; drop baseline_extend "
                "(each rung's budgets are the baseline's curve)"
            )
        for field in ("baseline_extend", "baseline_from"):
            if getattr(self, field) is not None and self.baseline is None:
                raise ValueError(
                    f"{field}: names the baseline's cells, but the study has no baseline; add "
                    f"`baseline: {{axis: value}}` or drop {field}"
                )
        return self

    @field_validator("probe", mode="before")
    @classmethod
    def _probe_layers(cls, v: Any) -> Any:
        """One clear message for ``layers`` (pydantic's would list each member of the union)."""
        if isinstance(v, dict) and "layers" in v:
            layers = v["layers"]
            blocks = isinstance(layers, list) and all(
                isinstance(b, int) and not isinstance(b, bool) for b in layers
            )
            if layers != "all" and not blocks:
                raise ValueError(
                    f"probe.layers: {str(layers)[:80]!r} is neither all nor a list of block "
                    "indices (integers >= 0)"
                )
        return v

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


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a study file, for editors."""
    return StudyFile.model_json_schema()
