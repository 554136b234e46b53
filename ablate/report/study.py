"""A study's report from its MLflow store: the cells come from the study (labels, baseline,
recipe), their state and validation curves from MLflow (read by ``ablate.tracking``), and
``build_report`` does the rest. The report is also attached to the study's parent run.

    report_study(load_study("studies/quickstart.yaml"))   # -> reports/quickstart/
"""

from __future__ import annotations

import errno
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ablate.errors import DamagedStoreError, ReportError
from ablate.report.ladder.render import LadderResult, build_ladder_report, ladder_metrics
from ablate.report.recorded import study_frames
from ablate.report.render import ReportResult, build_report
from ablate.report.run_metrics import config_summaries
from ablate.report.waves import asked_part, rows_of, sequential_lines
from ablate.tracking import StudyTracker, read_histories, study_status
from ablate.tracking.places import place_holding, record_folders
from ablate.tracking.vocab import ENDED, short_name

if TYPE_CHECKING:
    from ablate.study import Study


def probe_frame(study: Study, cells: pd.DataFrame) -> pd.DataFrame:
    """The probe metrics the report shows (``report.probes``), from the cells' MLflow runs; empty
    when none logged any."""
    from ablate.report.probes import PROBE_COLUMNS, probe_keys
    from ablate.tracking import read_metric_keys

    runs = study_status(study)
    key_of = {cs.run.run_id: cs.cell.key for cs in runs if cs.run is not None}
    names = read_metric_keys(study.tracking_uri, list(key_of), prefix="probe.")
    rows: list[tuple[str, int, str, float]] = []
    for rid, hist in read_histories(
        study.tracking_uri,
        [r for r in key_of if names.get(r)],
        keys=probe_keys(sorted({m for ms in names.values() for m in ms})),
    ).items():
        rows.extend((key_of[rid], s, m, v) for m, pts in hist.items() for s, v in pts)
    return pd.DataFrame(rows, columns=list(PROBE_COLUMNS))


def report_study(
    study: Study,
    out_dir: str | Path | None = None,
    *,
    attach: bool = True,
    titles: bool = True,
    mix_numerics: bool = False,
    mix_data: bool = False,
) -> ReportResult | LadderResult:
    """Write the study's report (default ``reports/<study>/``) and attach it to the parent run;
    ``titles`` False leaves the figures' titles out; ``mix_numerics`` compares runs of two
    numerics versions, ``mix_data`` cells of one data configuration that trained on other tokens
    (``build_report``). A study with sequential seeds reports the seeds its waves asked for and
    trained (``asked_part``)."""
    out = report_folder(study, out_dir)  # checked before the store is read
    every_seed = study  # a sequential study's waves replay over its every seed
    cells, evals = study_frames(study)
    if study.sequential is not None:  # the waves' seeds, from the frames read once
        study = asked_part(study, rows_of(study, cells, evals))
        keep = {c.key for c in study.cells}
        cells = cells[cells["key"].isin(keep)].reset_index(drop=True)
        evals = evals[evals["key"].isin(keep)].reset_index(drop=True)
    ended = cells["status"].isin(ENDED)
    if not ended.any():
        raise ReportError(
            f"study {study.name}: no finished runs yet in {study.tracking_uri} "
            f"({len(cells)} cells: {_counts(cells)}); run `ablate run` first"
        )
    decisions = sequential_lines(every_seed, cells, evals)
    notes = []
    if not ended.all():
        notes.append(
            f"{int((~ended).sum())} of {len(cells)} runs have not ended ({_counts(cells)})."
        )
    target = study.target
    if target is None:
        raise ReportError(
            f"study {study.name}: no target and no baseline to derive one from; add "
            "`target: {val_ppl: ...}` or `baseline:` to the study"
        )
    tuning: list[dict[str, Any]] = []
    if study.file.tune is not None:
        from ablate.tune.storage import tune_summary

        try:
            tuning = tune_summary(study)
        except DamagedStoreError as e:  # the results are in MLflow: report them, say why not this
            notes.append(f"No tuning section: {e}.")
    if study.file.ladder is not None:
        mix = (mix_numerics, mix_data)
        return _report_ladder(study, cells, evals, out, notes, attach, titles, *mix)
    probes = probe_frame(study, cells)
    result = build_report(
        cells,
        evals,
        target,
        study.file.speedup,
        out,
        study=study.name,
        notes=notes,
        tuning=tuning,
        probes=probes,
        probe_settings=study.file.probe.to_dict() if study.file.probe is not None else None,
        titles=titles,
        mix_numerics=mix_numerics,
        mix_data=mix_data,
        decisions=decisions,
    )
    if attach:
        tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
        _log_summaries(tracker, study, result)
        parent = tracker.parent_run(study.text) if study.text else None
        if parent is not None:
            tracker.log_files(parent, out, result.files, "report")
            names = {c.config_label: short_name(c, seed=False) for c in study.cells}
            tracker.log_metrics(parent, config_summaries(result.config_table, names), step=0)
    return result


def report_folder(study: Study, out_dir: str | Path | None) -> Path:
    """The report's folder (default ``reports/<study>/``); ``ReportError`` naming ``-o/--out``
    when it is empty (not the current folder), a file, the study's output folder itself, or one
    of the folders of its records or inside one (``record_folders``: a report there would sit
    among them), or a folder this process cannot make or write (under a file, ``/proc``, a
    read-only mount; tried with a folder made and removed in the nearest part of it that is
    there). A folder of its own in the output folder is
    fine (``make quickstart``: ``runs/quickstart/report/``)."""
    if out_dir is not None and not str(out_dir).strip():  # Path("") is the current folder
        raise ReportError(
            f"-o/--out: an empty path; give a folder for the report, or leave -o out (default "
            f"reports/{study.name}/)"
        )
    out = Path(out_dir) if out_dir is not None else Path("reports") / study.name
    if out.exists() and not out.is_dir():
        raise ReportError(f"-o/--out: {out} is a file; give a folder for the report")
    own = f"give a folder of its own (default reports/{study.name}/)"
    if out.resolve() == study.output_dir.resolve():
        raise ReportError(
            f"-o/--out: {out} is the study's output folder, beside its MLflow store; nothing was "
            f"written: {own}"
        )
    held = place_holding(out, record_folders(study))
    if held is not None:
        raise ReportError(
            f"-o/--out: {out} is in {held[0]}, {held[1]}, where the study's records are; "
            f"nothing was written: {own}"
        )
    # the nearest part of it that is there: a folder this process can make a folder in
    here = next(p for p in (out.absolute(), *out.absolute().parents) if os.path.lexists(p))
    try:
        if not here.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{here} is not a folder")
        os.rmdir(tempfile.mkdtemp(prefix=".ablate-report-", dir=here))
        why = None
    except NotADirectoryError as e:
        why = e.strerror
    except OSError as e:
        why = f"{e.strerror or e} in {here}"
    if why is not None:
        raise ReportError(
            f"-o/--out: {out} cannot be made or written ({why}); nothing was written: give a "
            "folder this user can write"
        )
    return out


def _report_ladder(
    study: Study,
    cells: pd.DataFrame,
    evals: pd.DataFrame,
    out: Path,
    notes: list[str],
    attach: bool,
    titles: bool,
    mix_numerics: bool,
    mix_data: bool,
) -> LadderResult:
    """A ladder study's report (``ablate.report.ladder.render``), attached to the parent run with
    the prediction's figures as its metrics."""
    ladder = study.file.ladder
    assert ladder is not None
    predict = (ladder.predict.params, ladder.predict.tokens) if ladder.predict else None
    result = build_ladder_report(
        cells,
        evals,
        study.target,
        study.file.speedup,
        out,
        study=study.name,
        predict=predict,
        boot=ladder.boot,
        seed=ladder.seed,
        notes=notes,
        titles=titles,
        mix_numerics=mix_numerics,
        mix_data=mix_data,
    )
    if attach:
        tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
        for res in result.rungs.values():
            _log_summaries(tracker, study, res)
        parent = tracker.parent_run(study.text) if study.text else None
        if parent is not None:
            tracker.log_files(parent, out, result.files, "report")
            tracker.log_metrics(parent, ladder_metrics(result), step=0)
    return result


def _log_summaries(tracker: StudyTracker, study: Study, result: ReportResult) -> None:
    """Each cell's summary metrics (``run_metrics``) into its run, at its last step."""
    runs = tracker.cell_runs()
    last = dict(zip(result.cell_table["key"], result.cell_table["last_step"], strict=True))
    for key, metrics in result.run_summaries.items():
        run = runs.get(key)
        step = last.get(key, math.nan)
        if run is not None and metrics:
            tracker.log_metrics(run.run_id, metrics, step=int(step) if math.isfinite(step) else 0)


def _counts(cells: pd.DataFrame) -> str:
    return ", ".join(f"{n} {s}" for s, n in cells["status"].value_counts().items())
