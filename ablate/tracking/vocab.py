"""The names ``ablate`` writes into MLflow: every tag, role and status, spelled here and nowhere else.

A study's experiment holds three roles of run, told apart by the tag ``ablate.role``:

- ``study``: the parent run (``ablate.study``), holding ``study.yaml`` and the report;
- ``cell``: one per cell (``ablate.key``, ``ablate.label``, ``ablate.config``, ``ablate.seed``,
  ``ablate.baseline``, the recipe as ``ablate.recipe`` / ``ablate.fp4_gemms`` / ``ablate.intervention``
  / ``ablate.fp4_format`` / ``ablate.base_format``, ``ablate.backend``, ``ablate.tokens_per_step``,
  and every axis value as ``ablate.axis.<axis>``; a member of a family of decay branches
  (``ablate.study.families``) also ``ablate.family``, and a branch ``ablate.trunk`` (its trunk's
  key) and ``ablate.branch_point`` (the step its decay starts));
- ``trial``: one per ``ablate tune`` trial (``ablate.search``, ``ablate.trial``,
  ``ablate.optuna_study``, ``ablate.param.<path>``, and the cell tags ``key``, ``label``, ``recipe``,
  ``seed``).

Every run has ``ablate.status`` (``STATUSES``) and, once it ends, details as ``ablate.<detail>``:
``steps``, ``wall_time_s``, ``tokens_per_s``, ``reason``, ``diverged_at``, ``traceback``, ``host``,
``pid``, ``resumed_from``, on SLURM ``node`` and ``slurm_job`` (the node and job of the attempt that
trained it last); a trial also ``tune_state`` and ``value``; the parent ``cells``, ``failed``,
``tune_status`` and ``tune_trials``. A branch that started from its trunk's checkpoint has its
trunk's metrics up to the branch point copied into it, and says so as ``branch_of`` (the trunk's
run id) and ``branch_step`` (the last step copied); a branch without them trained from step 0.
A baseline seed copied from another study's store (``baseline_from``) says where from as
``reused_from`` (that study and store) and ``reused_run`` (its run id there).
Readers get these through ``CellRun``'s typed fields, never by
spelling a tag.

The experiment holds the study's driver lock (``ablate.tracking.lock``): one tag per driver that
claims it, ``ablate.driver.<lock>.<holder id>`` (``driver_tag``), its value the holder as JSON.

Every cell and trial run also records its provenance as ``env.<name>`` tags (``ablate.train.
provenance``: code version, commit and code hash, torch, device, precision, backend). They keep the
values of the attempt that started the run; a resumed attempt that differs adds ``env.<name>.resumed``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from ablate.study.axes import fmt_value
from ablate.study.cells import Cell
from backends.recipes import GEMMS
from backends.recipes.recipe import selection_label

PREFIX = "ablate."
ROLE = PREFIX + "role"
STUDY = PREFIX + "study"
KEY = PREFIX + "key"
LABEL = PREFIX + "label"
STATUS = PREFIX + "status"
REASON = PREFIX + "reason"
DIVERGED_AT = PREFIX + "diverged_at"
TOKENS_PER_S = PREFIX + "tokens_per_s"
FAMILY = PREFIX + "family"
TRUNK = PREFIX + "trunk"
BRANCH_POINT = PREFIX + "branch_point"
BRANCH_OF = PREFIX + "branch_of"
BRANCH_STEP = PREFIX + "branch_step"
NODE = PREFIX + "node"  # the SLURM node that trained the run last (``slurm_place`` in the worker)
REUSED_FROM = PREFIX + "reused_from"  # a baseline seed copied from another store: which study
REUSED_RUN = PREFIX + "reused_run"  # and which run there (``ablate.driver.reuse``)
DRIVER = PREFIX + "driver."  # experiment tags: ablate.driver.<lock>.<holder id> (driver_tag)
ENV = "env."  # provenance: env.<name> (ablate.train.provenance), and env.<name>.resumed
PARENT = "mlflow.parentRunId"  # MLflow's own: the UI nests child runs under it
DESCRIPTION = "mlflow.note.content"  # MLflow's own: a run's description in the UI
EXPERIMENT_KIND = "mlflow.experimentKind"  # MLflow's own: which view the UI opens the experiment in
TRAINING_KIND = "custom_model_development"  # MLflow 3's training view (runs table), not GenAI's
SHARED_VIEW = "mlflow.sharedViewState."  # MLflow's own: an experiment tag holding a runs-table view
VIEW = "ablate"  # the view ``ablate ui`` opens: SHARED_VIEW + VIEW, ?viewStateShareKey=ablate
SUMMARY_METRICS = (
    "final_val_ppl",
    "best_val_ppl",
    "reached",
    "tokens_to_target",
    "equal_loss_token_ratio",
    "diverged_at",
)
"""What ``ablate report`` writes into each cell's run (``ablate.report.run_metrics``)."""
AXIS_PARAMS = ("recipe", "fp4_gemms", "intervention", "fp4_format", "base_format")
"""The params the driver logs on each cell's run (``cell_params``)."""

Role = Literal["study", "cell", "trial"]

ENDED = ("finished", "diverged")
"""The statuses of a run that is a result: it ran to its end, or found out that the recipe
diverges."""

STATUSES: dict[str, str | None] = {
    # ablate status -> MLflow run status (None: leave the MLflow status alone)
    "pending": None,
    "running": "RUNNING",
    "finished": "FINISHED",
    "diverged": "FINISHED",  # the run completed its job: it found out that the recipe diverges
    "failed": "FAILED",
    "interrupted": "KILLED",
    "stopped": "KILLED",  # the trainer paused on purpose (stop_after); resumable like interrupted
}


def tag(detail: str) -> str:
    """``ablate.<detail>``: the tag of a status detail or label (see the module docstring)."""
    return PREFIX + detail


def driver_tag(lock: str, holder: str = "") -> str:
    """The experiment tag of one driver's claim on the study's lock ``lock`` (``run``, ``tune``);
    without ``holder``, the prefix that all claims on that lock share."""
    return f"{DRIVER}{lock}.{holder}"


def env_tag(name: str, *, resumed: bool = False) -> str:
    """``env.<name>``: one provenance field of the run (``ablate.train.provenance``); with
    ``resumed``, ``env.<name>.resumed``: a later attempt's different value."""
    return ENV + name + (".resumed" if resumed else "")


def env_of(tags: Mapping[str, str]) -> dict[str, str]:
    """The provenance fields a run's tags hold, by name (``.resumed`` variants included)."""
    return {k[len(ENV) :]: v for k, v in tags.items() if k.startswith(ENV)}


def role_filter(role: Role) -> str:
    """MLflow search filter for the runs of one role."""
    return f"tags.`{ROLE}` = '{role}'"


def study_tags(study: str) -> dict[str, str]:
    return {ROLE: "study", STUDY: study}


def run_tags(role: Role, key: str, label: str, parent_id: str) -> dict[str, str]:
    """The tags every child run starts with (status ``pending``)."""
    return {PARENT: parent_id, ROLE: role, KEY: key, LABEL: label, STATUS: "pending"}


def cell_tags(cell: Cell) -> dict[str, str]:
    """What tracking records about a cell besides its params: labels, recipe, axis values."""
    r = cell.config.recipe
    fp4 = [g for g in GEMMS if r.gemm(g).is_fp4]
    out = {
        tag("config"): cell.config_label,
        tag("seed"): str(cell.seed),
        tag("baseline"): str(cell.baseline).lower(),
        tag("recipe"): r.short(),
        tag("fp4_gemms"): "+".join(fp4),
        tag("backend"): cell.config.backend,
        tag("tokens_per_step"): str(cell.config.train.tokens_per_step),
    }
    for k in ("intervention", "fp4_format", "base_format"):
        if k in cell.recipe_axes:
            out[tag(k)] = str(cell.recipe_axes[k])
    for axis, v in cell.values.items():
        out[tag(f"axis.{axis}")] = fmt_value(v)
    return out


def family_tags(family: str, trunk: str | None = None, point: int | None = None) -> dict[str, str]:
    """The tags of a family's member: its family; a branch also its trunk's key and its point."""
    out = {FAMILY: family}
    if trunk is not None and point is not None:
        out |= {TRUNK: trunk, BRANCH_POINT: str(point)}
    return out


def branch_details(trunk_run: str, step: int) -> dict[str, Any]:
    """The details of a branch that started from its trunk's checkpoint (its trunk's curve copied
    up to ``step``), as ``log_details`` takes them."""
    return {BRANCH_OF.removeprefix(PREFIX): trunk_run, BRANCH_STEP.removeprefix(PREFIX): step}


_GEMM_LETTER = {"fprop": "f", "dgrad": "d", "wgrad": "w"}
_RECIPE_AXES = ("fp4_gemms", "intervention", "fp4_format", "base_format")


def short_name(cell: Cell, *, seed: bool = True) -> str:
    """The run's name in the MLflow UI: short, and leading with what tells cells apart, e.g.
    ``dht16·fdw/fp8·s1`` (intervention, FP4 GEMMs by initial, base format, seed), ``fp8·s0`` for a
    baseline, ``nvfp4:fdw/fp8·s0`` for another FP4 format, a named recipe by its name
    (``nvidia_nvfp4·s0``) and a variant of one by its label, other axes as ``lr=0.003`` (zipped axes
    by the first of their group: ``dim=64`` for a size whose depth and width move together). The full
    label stays in the tag ``ablate.label``. Without ``seed``: the configuration's short name."""
    r, ax = cell.config.recipe, cell.recipe_axes
    fp4 = "".join(_GEMM_LETTER[g] for g in GEMMS if r.gemm(g).is_fp4)
    base = str(ax.get("base_format", "bf16"))
    parts = []
    named = cell.values.get("recipe")
    if named:  # a named recipe says it all (its GEMMs may differ: per-GEMM interventions);
        # a variant of one (a mapping) by its label, ``nvidia_nvfp4~wgrad.hadamard=none``
        # (the selection, such as keep_last, shows as an axis of its own)
        parts.append(
            named if isinstance(named, str) else r.short().removesuffix(selection_label(r))
        )
    elif fp4:
        fmt = str(ax.get("fp4_format", "mxfp4"))
        recipe = (f"{fmt}:" if fmt != "mxfp4" else "") + f"{fp4}/{base}"
        intervention = str(ax.get("intervention", "none"))
        parts.append(recipe if intervention == "none" else f"{intervention}·{recipe}")
    else:
        parts.append(base)
    for axis, v in cell.values.items():
        if axis not in (*_RECIPE_AXES, "recipe", "seed", *cell.zipped) and v is not None:
            parts.append(f"{axis.rsplit('.', 1)[-1]}={fmt_value(v)}")
    if seed:
        parts.append(f"s{cell.seed}")
    return "·".join(parts)


def cell_params(cell: Cell) -> dict[str, str]:
    """The study's recipe axes as MLflow params (the driver logs them when it creates the run), so
    that the UI can group, filter and compare runs by them; dotted axes such as ``train.lr`` and the
    seed are params already (the worker logs the flattened config)."""
    r = cell.config.recipe
    fp4 = [g for g in GEMMS if r.gemm(g).is_fp4]
    ax = cell.recipe_axes
    return {
        "recipe": r.short(),
        "fp4_gemms": "+".join(fp4) or "none",
        "intervention": str(ax.get("intervention", "none")),
        "fp4_format": str(ax.get("fp4_format", "mxfp4")) if fp4 else "none",
        "base_format": str(ax.get("base_format", "bf16")),
    }


def trial_tags(
    search: str, number: int, optuna_study: str, params: Mapping[str, str]
) -> dict[str, str]:
    """Tags of a tune trial's run; ``params`` maps each searched path to its value as text."""
    out = {
        tag("search"): search,
        tag("trial"): str(number),
        tag("optuna_study"): optuna_study,
    }
    out.update({tag(f"param.{k}"): v for k, v in params.items()})
    return out


def recipe_tags(recipe: str, seed: int) -> dict[str, str]:
    return {tag("recipe"): recipe, tag("seed"): str(seed)}


class OutcomeLike(Protocol):
    """How a run ended, as the runner's ``Outcome`` says it."""

    @property
    def steps(self) -> int: ...
    @property
    def wall_time_s(self) -> float: ...
    @property
    def tokens_per_s(self) -> float: ...
    @property
    def reason(self) -> str: ...
    @property
    def diverged_at(self) -> int | None: ...


def outcome_details(o: OutcomeLike) -> dict[str, Any]:
    """The status details recorded when a run ends (see the module docstring)."""
    info: dict[str, Any] = {"steps": o.steps, "wall_time_s": round(o.wall_time_s, 1)}
    if o.tokens_per_s:
        info["tokens_per_s"] = round(o.tokens_per_s, 1)
    if o.reason:
        info["reason"] = o.reason[:500]
    if o.diverged_at is not None:
        info["diverged_at"] = o.diverged_at
    return info


def number(tags: Mapping[str, str], name: str) -> float:
    """A numeric tag, NaN when absent or not a number."""
    v = tags.get(name)
    try:
        return float(v) if v not in (None, "", "None") else math.nan
    except ValueError:
        return math.nan
