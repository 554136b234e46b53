"""``ablate report``: tokens to a target perplexity, relative token cost, projected speedup, figures.

Errors are ``ablate.errors.ReportError``. The library takes two tidy DataFrames (the contract is
in ``ablate.report.inputs``): ``cells``, one row per cell, and ``evals``, one row per (cell,
evaluation). Reading them from MLflow is the tracking layer's job; this package only computes and
renders.

Modules, by concept:

    speedup      the step-time model over the device table of ``ablate.study.speedup`` (pure Python)
    inputs       the DataFrame contract: check_inputs, clean_evals (pandas)
    frames       a study's cells and what their runs recorded, as the contract's ``cells`` rows
    stats        Student-t quantiles (incomplete beta) and the chi-squared tail, no SciPy
    censored     the censored log-normal estimate of tokens to target and relative cost, intervals
    paired       the relative cost with seeds as blocks: configuration + seed effects (two-way,
                 censored-normal where seeds are censored), the method behind each interval
    stalls       runs held on a plateau: which stalled, the rate per configuration with its exact
                 interval, Fisher's test against the baseline
    sequential   sequential seeds: a simultaneous confidence sequence per comparison over every
                 look, the decision (faster, slower, equivalent, open), whole studies simulated
    waves        a sequential study's waves replayed from its store: each comparison after each
                 wave, judged by ``sequential`` (``status``, the report, ``run``)
    planner      the seeds a decision needs at a stated power, from a noise model (``ablate
                 plan`` and the report's seed note)
    equal_loss   the equal-loss token ratio against the baseline's curves, censored pairs included
    verdict      better / indistinguishable / worse / undetermined, and the power note
    metrics      resolve_target, per_cell, per_config, report_notes (pandas; the tokens-to-target
                 crossing itself is ``ablate.targets``, shared with ``ablate tune``)
    notes        the words beside the numbers: per-configuration and study-level notes
    probes       the probe section: gradient-fidelity metrics per configuration, with figures
    plots        convergence curves, late-stage zoom, equal-loss ratio (matplotlib, no pyplot)
    bars         token-cost and projected-speedup bars with their intervals
    markup       number formatting, Markdown and self-contained HTML
    provenance   which code, commit, device and precision produced the runs, and the tokens they
                 trained on: two numerics versions or two sets of tokens are not compared (pandas)
    render       build_report: report.md, report.html, summary.csv, PNG + SVG figures
    run_metrics  the report's numbers as MLflow metrics of each child run and the parent run
    recorded     a study's cells and evaluations read from its MLflow store (``study_frames``)
    study        a study's report from its MLflow store (``report_study``), a ladder's included
    synthetic    studies with known token costs (benchmark, tests, demos)
    ladder       the scaling ladder, a room of its own: Quartet's law and the model-free trend
                 fitted over a ladder's rungs, the prediction at the user's scale and its
                 back-test, the simulation that calibrates them, the ladder's report section

The benchmark of a 200-run report is ``python -m ablate.bench.report``.

This ``__init__`` imports neither pandas nor matplotlib: heavy names load on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.lazy import lazy_getattr

if TYPE_CHECKING:
    from ablate.report.inputs import check_inputs
    from ablate.report.metrics import per_cell, per_config, resolve_target
    from ablate.report.render import ReportResult, build_report

_LAZY = {
    "build_report": "ablate.report.render",
    "ReportResult": "ablate.report.render",
    "resolve_target": "ablate.report.metrics",
    "per_cell": "ablate.report.metrics",
    "per_config": "ablate.report.metrics",
    "check_inputs": "ablate.report.inputs",
}

__all__ = [
    "ReportResult",
    "build_report",
    "check_inputs",
    "per_cell",
    "per_config",
    "resolve_target",
]


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
    __getattr__ = lazy_getattr(__name__, _LAZY)
