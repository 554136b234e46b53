"""Which model of a configuration's penalty predicts the ladder's own largest sizes: each is
refitted without them and scored on what they measured (``holdout_scores``).

An origin is a size the refit leaves out together with every larger one: the largest size, and,
with five sizes or more, each size from the fourth on (rolling origin), so every refit keeps at
least three sizes. A model's score is the mean square, over the held-out size's configuration runs
and budgets (each paired with the baseline's run of the same seed and budget), of the measured
penalty (log loss over the baseline's) less the one the refit predicts there; the scores of all
origins add; ``prefers`` names the lower.

The report states the preference beside the prediction; it does not pick the prediction's model.
In simulation (docs/ladders.md) the back-test cannot tell a penalty that changes with size by as
much as the MXFP4 paper's question needs (a token ratio of 1.39 at 30M against 1.19 at 8B, k =
0.028) from a constant one at a run-to-run spread of 1%: the slope's standard error, about 0.04 with
four sizes over 10x and two seeds, exceeds it, and a prediction chosen by the back-test inherits
most of the constant penalty's bias there (+0.07 to +0.12 in the ratio under the falling penalty,
-0.03 to -0.06 under the rising one). The prediction is the sloped model's, which nests the
constant one.
"""

from __future__ import annotations

import numpy as np

from ablate.report.ladder.fit import MODELS, Design, Fit, fit, penalty_observed

MIN_SIZES = 3
"""The fewest sizes a back-test's refit keeps."""


def origins(d: Design, train: np.ndarray) -> list[float]:
    """The sizes held out in turn (see the module docstring); [] with fewer than four sizes."""
    sizes = np.unique(d.params[train & (d.group == 0)])
    return [float(s) for s in sizes[MIN_SIZES:]]


def holdout_scores(
    d: Design, log_y: np.ndarray, train: np.ndarray, n0: float, starts: np.ndarray
) -> dict[int, np.ndarray]:
    """Per configuration's group, each model's score (K, len(MODELS)) on ``log_y``'s K rows (the
    refits start from ``starts``, as ``fit``'s)."""
    k = log_y.shape[0]
    scores = {g: np.zeros((k, len(MODELS))) for g in range(1, len(d.groups))}
    for size in origins(d, train):
        sub = train & (d.params < size)
        refit: Fit = fit(d, log_y, sub, starts, n0)
        for g in refit.eff["quartet"]:
            rows = np.flatnonzero(train & (d.group == g) & (d.params == size) & (d.partner >= 0))
            if not len(rows):
                continue
            seen = penalty_observed(d, log_y, rows)
            for j, model in enumerate(MODELS):
                pred = refit.penalty(model, g, d.params[rows], d.tokens[rows])
                scores[g][:, j] += np.mean((seen - pred) ** 2, axis=1)
    return scores


def prefers(scores: np.ndarray) -> str:
    """The model of the lower score (``scores``: (len(MODELS),)); ``quartet`` on a tie (nothing
    held out), the constant penalty being the fewer parameters."""
    return MODELS[1] if scores[1] < scores[0] else MODELS[0]
