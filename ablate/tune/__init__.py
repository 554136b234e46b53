"""``ablate tune``: Optuna searches over a study's ``tune:`` space, trials run by the study's
executor and logged to its MLflow experiment.

Modules, by concept:

    storage  the Optuna side: storage and names, start fingerprint, sampler, pruner, suggestions,
             and what the searches found (tune_summary, best.yaml); imports neither Ray nor MLflow
    driver   run_tune: asks Optuna for trials, runs them as tasks, prunes, tells Optuna the result

The ``tune:`` section itself (schema, searches, checks) is part of the study (``ablate.study``).
"""

from __future__ import annotations

from ablate.tune.driver import NOT_REACHED_FACTOR, TuneResult, resolve_target_ppl, run_tune
from ablate.tune.storage import (
    format_summary,
    optuna_name,
    storage_url,
    tune_spec,
    tune_summary,
    write_best,
)

__all__ = [
    "NOT_REACHED_FACTOR",
    "TuneResult",
    "format_summary",
    "optuna_name",
    "resolve_target_ppl",
    "run_tune",
    "storage_url",
    "tune_spec",
    "tune_summary",
    "write_best",
]
