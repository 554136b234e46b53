"""What ``ablate run`` does to each cell of a study, planned against what MLflow already holds
(``plan``; read only: planning creates nothing), the warning when the study's target leaves no
room to measure a cost (``target_headroom``), and a ladder's sizes whose budgets do not bracket the
tokens per parameter of its prediction (``ladder_brackets``). ``ablate plan`` prints the plan;
the runner follows it.

- ``run``: no MLflow run has its key yet -> create one and train from step 0 (a checkpoint of
  the cell that no run owns, its run deleted, is set aside: ``runner``);
- ``skip``: finished or diverged (both are results; one whose data changed since it trained says
  so: ``preparing.data_changes``, and that ``--rerun-stale`` reruns it once they are known to
  prepare to other tokens);
- ``resume``: started but not ended (interrupted, worker lost, driver killed) -> continue from its
  checkpoint (or from step 0 when there is none, its sidecar's ``checkpoint.pt`` missing included,
  or when it is damaged: set aside) in the same run;
- ``failed``: ended with an error -> left alone unless ``--rerun-failed``;
- ``stale-data``: started but not ended (or failed) on other prepared data than the study's data
  prepare to now (its ``data.fingerprint`` differs: a corpus file changed) -> resuming could not
  replay its batches, so ``run`` refuses before anything starts (``stale_data_refusal``), naming
  the field that changed. Before the changed files are prepared their tokens are not known (files
  only touched give the same): such a cell is planned as it would be otherwise, saying that its
  data changed and that ``run`` prepares them first;
- ``rerun``: a failed cell with ``--rerun-failed`` (continued like ``resume``), or a finished or
  diverged cell that other numerics code produced (stale) or that trained on other tokens than
  its data prepare to now (its ``data.fingerprint`` differs; files only touched, or changed and
  not prepared yet, are not known to: it stays a result), or a ``stale-data`` one, with
  ``--rerun-stale`` (from step 0 in a new run; the old run and its checkpoint are kept);
- ``reuse``: a baseline seed with no run here whose key has a result in the store ``baseline_from``
  names -> copied into this store, not trained (``ablate.driver.reuse``; ``run`` copies it before
  it plans, so only ``plan`` shows this action).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ablate.driver.preparing import DataChange, DataSet, data_changes, data_now, study_data
from ablate.driver.reuse import baseline_plan
from ablate.errors import CannotRunError, TrackingError
from ablate.study import Cell, Study
from ablate.targets import headroom_warning, reached_fraction, schedule_fraction, target_ppl_of
from ablate.tracking import CellRun, CellStatus, join_runs, study_status
from ablate.tracking.status import baseline_curves, count
from ablate.tracking.vocab import env_tag
from ablate.train.checkpoint import CHECKPOINT, checkpoint_missing, checkpoint_step
from ablate.train.damage import checkpoint_damage
from ablate.train.provenance import code_hash

Action = Literal["run", "skip", "resume", "failed", "stale-data", "rerun", "reuse"]
ACTIONS: tuple[Action, ...] = ("run", "resume", "rerun", "reuse", "skip", "failed", "stale-data")
TO_RUN = ("run", "resume", "rerun")


@dataclass(frozen=True)
class PlannedCell:
    cell: Cell
    action: Action
    run: CellRun | None = None
    why: str = ""
    fresh: bool = False
    """Rerun from step 0 in a new MLflow run (a stale result: the old run and its checkpoint are
    kept, the checkpoint moved aside)."""
    data_change: DataChange | None = None
    """How its data changed since its run trained on them (``preparing.data_changes``)."""
    damaged: str = ""
    """Why its checkpoint is damaged (``checkpoint_damage``; "": not found so): ``run`` sets it
    aside and trains the cell from step 0 in the same run, not from a branch point."""


def stale(run: CellRun) -> str:
    """Why a recorded result came from other numerics code than this process runs ("" when it did
    not, or when the run predates provenance records)."""
    recorded = run.tags.get(env_tag("code_hash"))
    if not recorded or recorded == code_hash():
        return ""
    return f"code_hash {recorded}, now {code_hash()}"


def plan_cell(
    cell: Cell,
    run: CellRun | None,
    *,
    rerun_failed: bool,
    ckpt_step: int | None,
    rerun_stale: bool = False,
    data_change: DataChange | None = None,
    damaged: str = "",
    missing: int | None = None,
) -> PlannedCell:
    """What ``run`` does to one cell, given its recorded run, its checkpoint's step (and why that
    checkpoint is damaged: ``PlannedCell.damaged``; or the step its sidecar names where its
    ``checkpoint.pt`` is missing: ``checkpoint_missing``) and how its data changed since its run
    trained on them (None: they did not, or that is not known)."""
    if run is None:
        return PlannedCell(cell, "run", None, "new")
    change = data_change
    if run.status in ("finished", "diverged"):
        old = stale(run)
        other_tokens = change is not None and change.tokens
        if (old or other_tokens) and rerun_stale:
            why = f"{run.status} by other code ({old})" if old else run.status
            if change is not None:
                why += f"; {change.said()}"
            why += "; again from step 0 in a new run"
            return PlannedCell(cell, "rerun", run, why, fresh=True, data_change=change)
        why = run.status
        if old:
            why = f"{run.status}; stale: other training code ({old}); --rerun-stale reruns it"
        if change is not None:
            why += f"; {change.said()}"
            if not change.tokens:
                why += ": `run --rerun-stale` prepares them first and reruns it if they did"
            elif not old:
                why += "; --rerun-stale reruns it"
        return PlannedCell(cell, "skip", run, why, data_change=change)
    if change is not None and change.tokens:
        if rerun_stale:
            why = f"{run.status}; {change.said()}; again from step 0 in a new run"
            return PlannedCell(cell, "rerun", run, why, fresh=True, data_change=change)
        why = f"{run.status}; {change.said()}; restore its data, or --rerun-stale"
        return PlannedCell(cell, "stale-data", run, why, data_change=change)
    planned = _resumed(cell, run, rerun_failed, ckpt_step, damaged, missing)
    if change is None:
        return planned
    why = f"{planned.why}; {change.said()}: run prepares them first and refuses it if they did"
    return dataclasses.replace(planned, why=why, data_change=change)


def _resumed(
    cell: Cell,
    run: CellRun,
    rerun_failed: bool,
    ckpt_step: int | None,
    damaged: str,
    missing: int | None,
) -> PlannedCell:
    """What ``run`` does to a cell whose run started and did not end with a result, on the data
    it trained on: resumed, rerun or left failed."""
    where = f"from the step-{ckpt_step} checkpoint" if ckpt_step else "from step 0"
    if damaged:
        step = f"step-{ckpt_step} " if ckpt_step else ""
        where = f"from step 0, its damaged {step}checkpoint set aside (kept)"
    elif missing is not None:
        where = f"from step 0, its step-{missing} checkpoint missing (no {CHECKPOINT})"
    if run.status == "failed":
        if rerun_failed:
            return PlannedCell(cell, "rerun", run, f"failed before; again {where}", damaged=damaged)
        why = f"failed ({run.reason[:80]}); --rerun-failed reruns it"
        return PlannedCell(cell, "failed", run, why)
    return PlannedCell(cell, "resume", run, f"{run.status}; {where}", damaged=damaged)


def plan_cells(
    study: Study,
    statuses: Iterable[CellStatus],
    *,
    rerun_failed: bool = False,
    rerun_stale: bool = False,
    data: Mapping[str, DataSet] | None = None,
) -> list[PlannedCell]:
    """Each cell's plan; ``data``: the data each cell reads now, by key (``preparing.data_now``;
    None: not compared with what its run trained on)."""
    statuses = list(statuses)
    changes = _changes(study, statuses, data or {})
    return [
        plan_cell(
            cs.cell,
            cs.run,
            rerun_failed=rerun_failed,
            ckpt_step=_ckpt_step(study, cs.cell),
            rerun_stale=rerun_stale,
            data_change=changes.get(cs.cell.key),
            damaged=_damage(study, cs.cell, cs.run),
            missing=_missing(study, cs.cell, cs.run),
        )
        for cs in statuses
    ]


def check_stale_data(study: Study, data: Mapping[str, DataSet]) -> None:
    """Refuse (``CannotRunError``) a study with ``stale-data`` cells, from what its store holds
    (read only: before ``run`` opens the store, so that a refusal changes nothing recorded)."""
    try:
        statuses = study_status(study)
    except TrackingError:  # nothing recorded yet (or a damaged store: refused when opened)
        return
    if why := stale_data_refusal(plan_cells(study, statuses, data=data)):
        raise CannotRunError(why)


def stale_data_refusal(planned: Iterable[PlannedCell]) -> str | None:
    """Why ``run`` must not start: the ``stale-data`` cells, with the data fields that changed and
    both fingerprints, and how to go on (None when there is none)."""
    cells = [p for p in planned if p.action == "stale-data" and p.run is not None]
    if not cells:
        return None
    lines = [
        f"cell {p.cell.label}: its {p.run.status} run {p.data_change.said()}"
        for p in cells
        if p.run is not None and p.data_change is not None
    ]
    return "\n".join(
        [
            *lines[:10],
            *([f"... and {len(lines) - 10} more"] if len(lines) > 10 else []),
            "resuming would not replay the batches it trained on: restore the data as they "
            "were, or run with --rerun-stale to set the run and its checkpoint aside (kept) "
            "and train the cell anew from step 0",
        ]
    )


def plan(
    study: Study, *, rerun_failed: bool = False, rerun_stale: bool = False
) -> list[PlannedCell]:
    """What ``run`` would do to each cell, from the study's MLflow store if it exists (read only:
    planning creates nothing)."""
    try:
        statuses = study_status(study)
    except TrackingError:  # nothing recorded yet: every cell is new
        statuses = join_runs(study, {})
    data = current_data(study)
    planned = plan_cells(
        study, statuses, rerun_failed=rerun_failed, rerun_stale=rerun_stale, data=data
    )
    reuse = baseline_plan(study, {p.cell.key: p.run for p in planned if p.run is not None})
    if reuse is None or not reuse.copy:
        return planned
    theirs = {c.key: r for c, r in reuse.copy}
    label = reuse.source.label
    return [
        PlannedCell(p.cell, "reuse", why=f"{label}, run {theirs[p.cell.key].run_id[:12]}")
        if p.cell.key in theirs
        else p
        for p in planned
    ]


def current_data(study: Study) -> dict[str, DataSet]:
    """The data each cell reads now, by key (``preparing.data_now``: the keys its files give, the
    sets prepared already; the others prepare in ``run``), read only; {} where its data are
    refused (the checks name the field)."""
    try:
        return data_now(study_data(study))
    except (FileNotFoundError, ValueError, ImportError):
        return {}


def data_changed(study: Study, statuses: Iterable[CellStatus]) -> dict[str, DataChange]:
    """By cell key, how the data of each recorded cell changed since its run trained on them
    (``preparing.data_changes``: read only, nothing tokenized), for ``ablate status``."""
    return _changes(study, statuses, current_data(study))


def _changes(
    study: Study, statuses: Iterable[CellStatus], data: Mapping[str, DataSet]
) -> dict[str, DataChange]:
    """``preparing.data_changes`` of the recorded cells of ``statuses`` against ``data``."""
    recorded = {cs.cell.key: cs.run.data for cs in statuses if cs.run is not None}
    return data_changes(recorded, data, study.data_cache()) if data else {}


def target_headroom(study: Study) -> str | None:
    """The warning when the baseline reaches the study's target late in its budget (so costly
    configurations show as "not reached" instead of their cost): from the baseline's recorded
    curves when it has finished runs, else from the schedule (``ablate.targets``)."""
    t = study.target
    if t is None:
        return None
    try:
        curves = baseline_curves(study)
    except TrackingError:  # nothing recorded yet
        curves = []
    if not curves:
        fraction = schedule_fraction(t.from_baseline, t.at)
        return headroom_warning(fraction, measured=False, tolerance=t.tolerance)
    try:
        target = target_ppl_of(t, curves)
    except ValueError:
        return None
    return headroom_warning(reached_fraction(curves, target), measured=True)


BRACKET = 2.0
"""A ladder size's budgets should reach this factor below and above the prediction's tokens per
parameter: the fits read each size near the target's ratio of tokens to parameters, and a size
whose budgets all lie on one side of it is extrapolated in D as well as in N."""


def ladder_design(study: Study) -> tuple[dict[int, set[tuple[int, int]]], int]:
    """A ladder's sizes N, each with its budgets (steps, tokens per step), and the fewest seeds
    its baseline trains at a rung."""
    from ablate.model import non_embedding_params

    budgets: dict[int, set[tuple[int, int]]] = {}
    sizes: dict[str, int] = {}  # N once per model (a model.hf one is built on the meta device)
    seeds: dict[tuple[int, int], set[int]] = {}
    for c in study.cells:
        t, model = c.config.train, repr(c.config.model.to_dict())
        if model not in sizes:
            sizes[model] = non_embedding_params(c.config.model)
        budgets.setdefault(sizes[model], set()).add((t.steps, t.tokens_per_step))
        if c.baseline:
            seeds.setdefault((sizes[model], t.steps), set()).add(c.seed)
    return budgets, min((len(v) for v in seeds.values()), default=0)


def ladder_brackets(study: Study) -> list[str]:
    """One warning per ladder size whose budgets do not bracket ``ladder.predict``'s tokens per
    parameter by ``BRACKET`` on both sides, naming the budgets that would (empty without a
    prediction)."""
    ladder = study.file.ladder
    if ladder is None or ladder.predict is None:
        return []
    want = ladder.predict.tokens / ladder.predict.params
    out = []
    for n, steps in sorted(ladder_design(study)[0].items()):
        per_step = max(p for _, p in steps)
        ratios = sorted(s * p / n for s, p in steps)
        low, high = want / BRACKET, want * BRACKET
        if ratios[0] <= low and ratios[-1] >= high:
            continue
        need = []
        if ratios[0] > low:
            need.append(
                f"at or below {low:.3g} tokens per parameter (train.steps <= {int(low * n // per_step)})"
            )
        if ratios[-1] < high:
            need.append(
                f"at or above {high:.3g} tokens per parameter (train.steps >= {-int(-high * n // per_step)})"
            )
        out.append(
            f"ladder: the size of N = {n / 1e6:.3g}M trains {', '.join(f'{r:.3g}' for r in ratios)} "
            f"tokens per parameter, which does not bracket the prediction's {want:.3g} by "
            f"{BRACKET:g}x on both sides: add a budget {' and one '.join(need)}, or the fits read "
            "this size on one side of the target's ratio only"
        )
    return out


LADDER_NOISE = 0.01
"""The run-to-run spread of a ladder's validation loss (relative) that ``ladder_width`` assumes
without a measurement: about what the CPU ladder measures between its seeds."""


def ladder_width(study: Study, points: Path | None = None, ladders: int = 16) -> str | None:
    """What the ladder's design is expected to give at ``ladder.predict``: the median width of
    the 95% interval over ``ladders`` synthetic ladders of its sizes, budgets and seeds
    (``ablate.report.ladder.simulate.expected_width``), with the noise and law measured from a
    report's ``points`` (its ``ladder_points.csv``) where there is one, else Chinchilla's law and
    ``LADDER_NOISE``. None without a prediction or with fewer than two sizes."""
    from ablate.report.ladder.simulate import CHINCHILLA, expected_width, measured

    ladder = study.file.ladder
    if ladder is None or ladder.predict is None:
        return None
    budgets, seeds = ladder_design(study)
    if len(budgets) < 2 or seeds < 1:
        return None
    law, noise, source = (
        CHINCHILLA,
        LADDER_NOISE,
        (f"Chinchilla's law and an assumed {LADDER_NOISE:.0%} run-to-run spread in loss"),
    )
    if points is not None and points.is_file():
        try:
            got = measured(points, next(c.ladder_config for c in study.cells if c.baseline))
            if got is not None:
                law, noise = got
                source = (
                    f"the law and the run-to-run spread ({noise:.2%} in loss) measured in {points}"
                )
        except (ValueError, KeyError, OSError) as e:
            source += f" ({points} not used: {e})"
    design = {
        float(n): tuple(sorted(float(s * p) for s, p in steps)) for n, steps in budgets.items()
    }
    target = (ladder.predict.params, ladder.predict.tokens)
    width, held = expected_width(law, design, seeds, target, noise, ladders=ladders)
    return (
        f"expected width of each configuration's 95% interval at N* = {target[0]:.3g}, D* = "
        f"{target[1]:.3g}: x{width:.2f} (hi / lo, the median of {ladders} simulated ladders of "
        f"this design, {len(design)} sizes and {seeds} seed(s), a configuration at effD 0.8 "
        f"under {source}; {held:.0%} of them held the truth). More seeds, sizes or a larger "
        "largest size narrow it (docs/ladders.md)"
    )


def summarize(planned: Iterable[PlannedCell]) -> dict[str, int]:
    """How many cells get each action, in ``ACTIONS`` order."""
    counts = count([p.action for p in planned])
    return {a: counts[a] for a in ACTIONS if a in counts}


def _ckpt_step(study: Study, cell: Cell) -> int | None:
    return checkpoint_step(study.checkpoint_dir(cell))


def _damage(study: Study, cell: Cell, run: CellRun | None) -> str:
    """Why the checkpoint of a cell that ``run`` may resume is damaged ("": not found so, or the
    cell has a result or no run, and no use for it)."""
    if run is None or run.status in ("finished", "diverged"):
        return ""
    return checkpoint_damage(study.checkpoint_dir(cell)) or ""


def _missing(study: Study, cell: Cell, run: CellRun | None) -> int | None:
    """The step the sidecar of a cell that ``run`` may resume names while its ``checkpoint.pt`` is
    missing (None: not so, or the cell has a result or no run)."""
    if run is None or run.status in ("finished", "diverged"):
        return None
    return checkpoint_missing(study.checkpoint_dir(cell))
