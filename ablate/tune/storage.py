"""The Optuna side of ``ablate tune``: where a study's searches are stored (``check_storage``
refuses a damaged or foreign ``optuna.db`` before Optuna opens it) and what they are named,
what a search starts from (``start_fingerprint``), the sampler, pruner and suggestions its ``tune``
section asks for, and what the searches found,
read back from the storage: a summary per search (for the terminal and the report) and
``best.yaml``, the best configuration per search as a study grid.

Imports neither Ray nor MLflow, so the report can read a study's searches cheaply.
``tune_summary`` computes parameter importance (Optuna's default evaluator) only for a search with
at least ``IMPORTANCE_MIN_TRIALS`` complete trials and more than one parameter, and records None
when the evaluator fails (e.g. no variation).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import Trial, TrialState

from ablate.errors import DamagedStoreError, TuneError
from ablate.study.axes import fmt_value, with_values
from ablate.study.cells import Study
from ablate.study.schema import SearchParam, TuneSection
from ablate.study.tune import Search, param_kind, plan_searches
from ablate.tracking.store import check_sqlite_file

STORAGE = "optuna.db"
IMPORTANCE_MIN_TRIALS = 4
OPTUNA_TABLES = frozenset({"version_info", "studies"})
"""Tables that every Optuna RDB storage has; a SQLite file with other tables and not these is
someone else's database."""


def storage_url(study: Study) -> str:
    return "sqlite:///" + str((study.output_dir / STORAGE).resolve())


def check_storage(study: Study) -> None:
    """``DamagedStoreError`` where ``<output>/optuna.db`` is there, not empty, and not an Optuna
    storage: a file SQLite cannot read (``ablate.tracking.store.check_sqlite_file``'s check), or a
    SQLite database with tables but not Optuna's (``OPTUNA_TABLES``; e.g. a copy of mlflow.db, into
    which Optuna would write its tables). Its table names read once through a read-only connection:
    nothing written. A missing or empty file, or one without tables, passes (Optuna creates its
    tables there), and so does a busy one."""
    path = (study.output_dir / STORAGE).resolve()
    fix = "move it aside to start the searches anew"
    tables = check_sqlite_file(path, what="the Optuna storage", fix=fix)
    if tables and not tables >= OPTUNA_TABLES:
        raise DamagedStoreError(
            f"{path} is not an Optuna storage: a SQLite database with other tables "
            f"({', '.join(sorted(tables)[:4])}{', ...' if len(tables) > 4 else ''}) and not "
            f"Optuna's ({', '.join(sorted(OPTUNA_TABLES))}); nothing was written: restore it "
            f"from a copy, or {fix}"
        )


def optuna_name(study: Study, search: Search) -> str:
    return f"{study.name}/{search.label}"


def start_fingerprint(tune: TuneSection, study: Study, search: Search) -> str:
    """Identity of what a search's trials start from: its cell's config without the searched
    paths (a search that continues must start from the same place)."""
    d = with_values(study.file.base.model_dump(mode="json"), dict(search.cell.values))
    for path in [*tune.space, "device"]:
        section, _, name = path.rpartition(".")
        (d.get(section, {}) if section else d).pop(name, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def tune_spec(study: Study) -> TuneSection:
    if study.file.tune is None:
        raise TuneError(
            f"study {study.name} has no tune: section; add one, e.g. tune: {{per: [base_format], "
            "trials: 8, space: {train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}}}"
        )
    return study.file.tune


def suggest(trial: Trial, path: str, p: SearchParam) -> Any:
    """The trial's value of one searched path (its Optuna parameter is named by the path)."""
    kind = param_kind(path, p)
    if kind == "categorical":
        return trial.suggest_categorical(path, p.choices or [])
    assert p.low is not None and p.high is not None  # check_tune refuses a range without them
    if kind == "int":
        step = int(p.step) if p.step is not None else 1
        return trial.suggest_int(path, int(p.low), int(p.high), step=step, log=p.log)
    return trial.suggest_float(path, p.low, p.high, step=p.step, log=p.log)


def distribution(path: str, p: SearchParam) -> optuna.distributions.BaseDistribution:
    """The Optuna distribution that ``suggest`` draws ``path`` from."""
    kind = param_kind(path, p)
    if kind == "categorical":
        return optuna.distributions.CategoricalDistribution(p.choices or [])
    assert p.low is not None and p.high is not None
    if kind == "int":
        step = int(p.step) if p.step is not None else 1
        return optuna.distributions.IntDistribution(int(p.low), int(p.high), log=p.log, step=step)
    return optuna.distributions.FloatDistribution(p.low, p.high, log=p.log, step=p.step)


def continuation_problems(ostudy: optuna.Study, tune: TuneSection, start: str) -> list[str]:
    """Why an existing search cannot go on under this spec: another objective, another start
    config (``start_fingerprint``), or a parameter whose kind, log scale or choices changed."""
    attrs = ostudy.user_attrs
    problems = []
    if attrs.get("objective", tune.objective) != tune.objective:
        problems.append(f"tune.objective: it searched {attrs['objective']}, not {tune.objective}")
    if attrs.get("start_config", start) != start:
        problems.append("its start configuration changed (the base or the grid's values)")
    seen: dict[str, optuna.distributions.BaseDistribution] = {}
    for t in ostudy.get_trials(deepcopy=False):
        seen.update(t.distributions)
    for path, p in tune.space.items():
        if path in seen:
            try:
                optuna.distributions.check_distribution_compatibility(
                    seen[path], distribution(path, p)
                )
            except ValueError as e:
                problems.append(f"tune.space.{path}: {e} (earlier trials: {seen[path]})")
    return problems


def make_sampler(tune: TuneSection, n_before: int) -> optuna.samplers.BaseSampler:
    seed = tune.sampler.seed + n_before
    if tune.sampler.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(
        seed=seed,
        n_startup_trials=tune.sampler.startup_trials,
        constant_liar=tune.parallelism > 1,
    )


def make_pruner(tune: TuneSection) -> optuna.pruners.BasePruner:
    p = tune.pruner
    if p is None:
        return optuna.pruners.NopPruner()
    if p.kind == "threshold":
        return optuna.pruners.ThresholdPruner(upper=p.max_val_loss)
    if p.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials)
    return optuna.pruners.PatientPruner(None, patience=p.patience, min_delta=p.min_delta)


def count_trials(trials: list[optuna.trial.FrozenTrial]) -> dict[str, int]:
    """Trials that count towards a search's total, by state (interrupted ones do not)."""
    counts = {"complete": 0, "pruned": 0, "failed": 0}
    for t in trials:
        if t.state == TrialState.COMPLETE:
            counts["complete"] += 1
        elif t.state == TrialState.PRUNED:
            counts["pruned"] += 1
        elif t.state == TrialState.FAIL and not t.user_attrs.get("interrupted"):
            counts["failed"] += 1
    return counts


def tune_summary(study: Study) -> list[dict[str, Any]]:
    """Per search in the Optuna storage: search, study_name, objective, n_trials, complete,
    pruned, failed, best_value, best_trial, best_params, importance (None below 4 complete trials
    or with one parameter), values (of the ``per`` axes), start_cell. Reads only; [] before any
    ``ablate tune``; ``DamagedStoreError`` for a storage that ``check_storage`` refuses."""
    if study.file.tune is None or not (study.output_dir / STORAGE).is_file():
        return []
    check_storage(study)
    tune = study.file.tune
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(storage_url(study))
    names = set(optuna.get_all_study_names(storage))
    rows = []
    for s in plan_searches(tune, study):
        name = optuna_name(study, s)
        if name not in names:
            continue
        ostudy = optuna.load_study(study_name=name, storage=storage)
        trials = ostudy.get_trials(deepcopy=False)
        counts = count_trials(trials)
        best = ostudy.best_trial if counts["complete"] else None
        importance = None
        if counts["complete"] >= IMPORTANCE_MIN_TRIALS and len(tune.space) > 1:
            with contextlib.suppress(Exception):  # too little variation, a degenerate space...
                importance = dict(optuna.importance.get_param_importances(ostudy))
        rows.append(
            {
                "search": s.label,
                "study_name": name,
                "objective": tune.objective,
                "n_trials": len(trials),
                **counts,
                "best_value": best.value if best else None,
                "best_trial": best.number if best else None,
                "best_params": dict(best.params) if best else {},
                "importance": importance,
                "values": dict(s.values),
                "start_cell": s.cell.label,
            }
        )
    return rows


def best_grid(study: Study, summary: list[dict[str, Any]]) -> list[dict[str, list[Any]]]:
    """One grid entry per search with a complete trial: its start cell's axis values (no seed)
    with the best parameters in place of the searched ones."""
    tune = tune_spec(study)
    cells = {s.label: s.cell for s in plan_searches(tune, study)}
    grid = []
    for row in summary:
        if not row["best_params"] or row["search"] not in cells:
            continue
        values = cells[row["search"]].values
        entry = {a: [v] for a, v in values.items() if a != "seed" and a not in tune.space}
        entry.update({p: [v] for p, v in row["best_params"].items()})
        grid.append(entry)
    return grid


def write_best(study: Study, summary: list[dict[str, Any]]) -> Path:
    """``<output>/tune/best.yaml``: the best configuration per search as a study ``grid:``."""
    lines = [
        f"# Best parameters per search of study {study.name} (`ablate tune`, {len(summary)} "
        "searches).",
        "# Use as a study's grid (add `seed: [0, 1, 2]` to each entry), with the same base:",
    ]
    for row in summary:
        if row["best_value"] is None:
            lines.append(f"#   {row['search']}: no complete trial yet (not in the grid)")
        else:
            lines.append(
                f"#   {row['search']}: best {row['objective']} {row['best_value']:.6g} (trial "
                f"{row['best_trial']} of {row['n_trials']})"
            )
    body = yaml.safe_dump(
        {"grid": best_grid(study, summary)}, sort_keys=False, default_flow_style=None
    )
    path = study.output_dir / "tune" / "best.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n" + body)
    os.replace(tmp, path)
    return path


def format_summary(summary: list[dict[str, Any]]) -> str:
    """One paragraph per search, for the terminal."""
    out = []
    for row in summary:
        head = (
            f"{row['search']}: {row['n_trials']} trials ({row['complete']} complete, "
            f"{row['pruned']} pruned, {row['failed']} failed)"
        )
        if row["best_value"] is None:
            out.append(f"{head}; no complete trial")
            continue
        params = ", ".join(f"{k}={fmt_value(v)}" for k, v in row["best_params"].items())
        out.append(
            f"{head}; best {row['objective']} {row['best_value']:.6g} "
            f"(trial {row['best_trial']}): {params}"
        )
        if row["importance"]:
            imp = ", ".join(f"{k} {v:.2f}" for k, v in row["importance"].items())
            out.append(f"  importance: {imp}")
    return "\n".join(out)
