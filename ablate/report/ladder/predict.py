"""A ladder's prediction at the user's scale: each configuration's token ratio at a target (N*, D*)
with a 95% interval, a back-test, and the trend in N.

``predict`` fits Quartet's law on the baseline and two models of each configuration's penalty
(``ablate.report.ladder.fit``): Quartet's constant one, and a sloped one whose data efficiency is a
power k of N, which nests it (k = 0). The prediction is the sloped model's token ratio at (N*, D*):
the tokens the configuration needs to reach the baseline's loss there, over D*. It holds whether
or not the penalty changes with size; the constant model's ratio is given beside it (narrower, and
biased when the penalty does change: docs/ladders.md's simulation), with the model whose refit
without the largest sizes predicted them better (``ablate.report.ladder.choose``).

The interval comes from a bootstrap over whole runs, paired by seed: a run (one size and seed,
every budget of it) of the baseline and the runs of every configuration with the same size and
seed move together. The bootstrap resamples runs' residuals from the sloped fit (each run's vector
of log-loss residuals over its budgets, the baseline's and the configurations' of one (size, seed)
as one unit, scaled up for the parameters the fit spent), adds them to the fitted losses, and
refits everything, a thousand times at once. Resampling residual units from the whole ladder
rather than the two or three seeds of one size is what lets two seeds give an interval that
covers (a case bootstrap of two seeds has three distinct outcomes per size); the simulation tests
measure the coverage. The model-free reading (``ablate.report.ladder.trend``) carries the measured
ratios' line in log N to N* with its own interval.

A configuration whose effN leaves a loss floor above the baseline's loss at (N*, D*) reaches it
with no budget: its ratio is ``inf`` ("no" in ``reachable`` when at least 97.5% of the replicates
say so, "uncertain" when more than 2.5% do, and the interval's upper end is then ``inf``).

``backtest`` refits without the largest size and asks whether the 95% interval for what that size
would measure covers what it did measure. That interval is the refit's prediction plus the
measurement's own seed noise, both from the same bootstrap (the held-out size's runs are drawn too
and measured as the real ones are), widened by Student's t for a noise scale estimated from a
handful of runs; in simulation it covers 92-95% of the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ablate.report.ladder.choose import holdout_scores, prefers
from ablate.report.ladder.fit import MODELS, Design, Fit, design, fit, middle
from ablate.report.ladder.law import Law, check_frame, laws_from_x, start_grid
from ablate.report.ladder.trend import fit_trend, pair_ratios, reference_tokens, tokens_to_loss_many
from ablate.report.stats import t975

BOOT = 1000
"""Bootstrap replicates of a prediction."""
LADDER_COLUMNS = (
    "config",
    "target_params",
    "target_tokens",
    "token_ratio",
    "ratio_lo",
    "ratio_hi",
    "method",
    "backtest_covered",
    "reachable",
)
"""The columns of ``ladder.csv``, one row per configuration and method."""
METHODS = ("sloped", "quartet", "trend")
"""``ladder.csv``'s methods: the prediction (the sloped penalty), Quartet's constant one alone, and
the model-free trend."""
PRIMARY = "sloped"
"""The model the prediction comes from (see the module docstring)."""


def _replicates(
    d: Design, point: Fit, train: np.ndarray, boot: int, rng: np.random.Generator
) -> np.ndarray:
    """``boot`` bootstrap copies of the ladder's log losses (boot, M): the point fit's values plus
    residual vectors of whole runs, drawn per (size, seed) as units that pair the baseline with
    every configuration, from the training sizes."""
    fitted = point.log_fitted(d)[0]
    resid = np.log(d.loss) - fitted
    shape = {k: tuple(len(v.get(g, ())) for g in range(len(d.groups))) for k, v in d.units.items()}
    pool = _pool(d, train)
    if not pool:
        raise ValueError("ladder: no size has runs of every configuration to resample")
    # residuals are smaller than the noise: by the parameters the fit spent on them, and, drawn
    # from a pool of U runs, by (U - 1) / U (most of the noise is a run's, shared by its budgets)
    n_obs = int(train.sum())
    n_par = 6 + 3 * (len(d.groups) - 1)  # the sloped model's
    scale = math.sqrt(n_obs / max(n_obs - n_par, 1) * len(pool) / max(len(pool) - 1, 1))
    out = np.repeat(fitted[None], boot, axis=0)
    for unit, groups in d.units.items():
        same = [k for k in pool if shape[k] == shape[unit]] or [k for k in pool if k[0] == unit[0]]
        if not same:
            raise ValueError(f"ladder: the runs of size {unit[0]:.3g} have no like to resample")
        draw = rng.integers(len(same), size=boot)
        for g, idx in groups.items():
            src = np.stack([d.units[same[j]][g] for j in range(len(same))])  # (U, budgets)
            if src.shape[1] != len(idx):
                continue
            out[:, idx] += scale * resid[src[draw]]
    return out


@dataclass(frozen=True)
class ConfigPrediction:
    """One configuration's prediction at a target (see the module docstring): the sloped model's
    ratio and interval, then Quartet's constant penalty's and the trend's alone."""

    config: str
    ratio: float
    lo: float
    hi: float
    prefers: str
    """The model whose refit without the largest sizes predicted them better (``MODELS``; the
    constant one when there are too few sizes to hold one out)."""
    p_unreachable: float
    quartet: tuple[float, float, float]
    """Quartet's constant penalty alone: ratio and 95% interval."""
    k: tuple[float, float, float]
    """The sloped model's power of N in effD, with its 95% interval."""
    scores: tuple[float, float]
    """Each model's mean square error on the held-out sizes (0, 0: too few sizes to hold one
    out; ``ablate.report.ladder.choose``)."""
    eff_n: tuple[float, float, float]
    eff_d: tuple[float, float, float]
    trend: tuple[float, float, float] | None
    """The model-free line's ratio at N* and its interval (None: too few measured rungs)."""
    slope: tuple[float, float] | None
    """The trend's slope of log ratio in log N and its standard error."""
    trend_changes: bool | None

    @property
    def reachable(self) -> str:
        if self.p_unreachable >= 0.975:
            return "no"
        return "uncertain" if self.p_unreachable > 0.025 else "yes"


def _quantiles(v: np.ndarray) -> tuple[float, float]:
    s = np.where(np.isnan(v), np.inf, v)
    q = np.quantile(s, [0.025, 0.975], method="inverted_cdf")  # no interpolation with inf
    return float(q[0]), float(q[1])


PENALTY_PARAMS = 3
"""The sloped model's parameters per configuration (effN, effD, k)."""


def _interval(point: float, reps: np.ndarray, runs: int) -> tuple[float, float, float]:
    """``point`` and the replicates' 95% interval, widened about their median by Student's t at
    ``runs`` - 1 - ``PENALTY_PARAMS`` degrees of freedom over the normal's, and holding ``point``.
    The bootstrap draws the noise from ``runs`` residual vectors that the fit has already spent
    parameters on, so its spread is itself a noisy estimate; simulated (docs/ladders.md), the plain
    percentile interval of two seeds on four sizes held the truth in 83-97% of ladders, the ones
    it missed being those whose residuals came out small by chance."""
    lo, hi = _quantiles(reps)
    finite = reps[np.isfinite(reps) & (reps > 0)]
    if len(finite) and math.isfinite(lo) and lo > 0:
        med = float(np.median(np.log(finite)))
        k = t975(max(runs - 1 - PENALTY_PARAMS, 1)) / 1.959964
        lo = math.exp(med + k * (math.log(lo) - med))
        hi = math.exp(min(med + k * (math.log(hi) - med), 700.0)) if math.isfinite(hi) else hi
    return point, min(lo, point), max(hi, point)


@dataclass
class LadderFit:
    """A ladder fitted: the point fit, its bootstrap replicates, and each model's back-test score
    (``fit_ladder``)."""

    design: Design
    point: Fit
    reps: Fit
    log_reps: np.ndarray
    """The replicates' log losses (boot, M)."""
    scores: dict[int, np.ndarray]
    """Group -> each model's back-test score (len(MODELS),)."""
    train: np.ndarray
    """The observations fitted (M,) bool."""

    @property
    def configs(self) -> list[str]:
        """The configurations fitted (not the baseline)."""
        return [self.design.groups[g] for g in self.point.eff["quartet"]]

    def prefers(self, config: str) -> str:
        """The model whose refit without the largest sizes predicted them better."""
        return prefers(self.scores[self.design.groups.index(config)])

    def ratios(
        self, config: str, params: float, tokens: float, model: str = PRIMARY
    ) -> tuple[float, np.ndarray]:
        """The token ratio of ``config`` at (``params``, ``tokens``) under ``model`` (``MODELS``):
        the point fit's and the replicates'."""
        g = self.design.groups.index(config)
        return float(self.point.ratios(model, g, params, tokens)[0]), self.reps.ratios(
            model, g, params, tokens
        )

    @property
    def runs(self) -> int:
        """The runs the bootstrap draws its noise from (``_pool``)."""
        return len(_pool(self.design, self.train))

    def interval(
        self, config: str, params: float, tokens: float, model: str = PRIMARY
    ) -> tuple[float, float, float]:
        """``model``'s token ratio of ``config`` at (``params``, ``tokens``) and its 95% interval
        (the replicates' widened by Student's t: ``_interval``)."""
        return _interval(*self.ratios(config, params, tokens, model), self.runs)

    def efficiency(self, config: str, model: str = "quartet") -> tuple[np.ndarray, np.ndarray]:
        """``model``'s efficiencies of ``config``: the point fit's (P,) and the replicates'
        (boot, P) (effN, effD, and for ``sloped`` k)."""
        g = self.design.groups.index(config)
        return self.point.eff[model][g][0], self.reps.eff[model][g]

    def law(self) -> Law:
        """The baseline's law (the point fit)."""
        return laws_from_x(self.point.law_x).take(0)


def fit_ladder(
    frame: pd.DataFrame,
    baseline: str,
    *,
    boot: int = BOOT,
    seed: int = 0,
    below: float | None = None,
    scored: bool = True,
) -> LadderFit:
    """The law, both models of every configuration's penalty, ``boot`` bootstrap refits of them
    all, and each model's back-test score (see the module docstring); ``below``: fit only the
    sizes below it (a back-test); ``scored`` False: no back-test of the models (their scores
    0, as with too few sizes), for a caller that reads neither ``prefers`` nor ``scores``."""
    d = design(frame, baseline)
    train = np.ones(len(d.loss), dtype=bool) if below is None else d.params < below
    base = train & (d.group == 0)
    if len(np.unique(d.params[base])) < 2 or len(np.unique(d.tokens[base])) < 2:
        raise ValueError(
            f"ladder: the baseline {baseline!r} needs at least two sizes and two budgets to fit "
            f"a law (has {len(np.unique(d.params[base]))} and {len(np.unique(d.tokens[base]))})"
        )
    grid = start_grid(float(d.loss[base].min()))
    n0 = middle(d, train)
    log_y = np.log(d.loss)[None]
    point = fit(d, log_y, train, grid, n0)
    reps = _replicates(d, point, train, boot, np.random.default_rng(seed))
    scores = (
        holdout_scores(d, log_y, train, n0, grid)
        if scored
        else {g: np.zeros((1, len(MODELS))) for g in range(1, len(d.groups))}
    )
    # each replicate starts from the point fit: its data are the point fit's plus noise
    return LadderFit(
        d,
        point,
        fit(d, reps, train, point.law_x, n0),
        reps,
        {g: v[0] for g, v in scores.items()},
        train,
    )


def predict(
    frame: pd.DataFrame,
    baseline: str,
    params: float,
    tokens: float,
    *,
    boot: int = BOOT,
    seed: int = 0,
) -> list[ConfigPrediction]:
    """Each configuration's token ratio at (``params``, ``tokens``) against ``baseline``, with its
    95% intervals (see the module docstring)."""
    return predict_many(frame, baseline, [(params, tokens)], boot=boot, seed=seed)[0]


def predict_many(
    frame: pd.DataFrame,
    baseline: str,
    targets: list[tuple[float, float]],
    *,
    boot: int = BOOT,
    seed: int = 0,
) -> list[list[ConfigPrediction]]:
    """``predict`` at several targets (N*, D*) from one bootstrap."""
    return predictions(fit_ladder(frame, baseline, boot=boot, seed=seed), frame, targets)


def predictions(
    fit: LadderFit, frame: pd.DataFrame, targets: list[tuple[float, float]]
) -> list[list[ConfigPrediction]]:
    """``predict_many`` from a ladder already fitted on ``frame``."""
    baseline = fit.design.groups[0]
    out = []
    for params, tokens in targets:
        pairs = pair_ratios(frame, baseline, tokens_per_param=tokens / params)
        preds = []
        for cfg in fit.configs:
            g = fit.design.groups.index(cfg)
            r0, r = fit.ratios(cfg, params, tokens)
            _, lo, hi = _interval(r0, r, fit.runs)
            tr = fit_trend(pairs, cfg)
            (en0, ed0), eff = fit.efficiency(cfg)
            sloped0, sloped = fit.efficiency(cfg, "sloped")
            preds.append(
                ConfigPrediction(
                    config=cfg,
                    ratio=r0,
                    lo=lo,
                    hi=hi,
                    prefers=fit.prefers(cfg),
                    p_unreachable=float(np.mean(~np.isfinite(r))),
                    quartet=fit.interval(cfg, params, tokens, "quartet"),
                    k=(float(sloped0[2]), *_quantiles(sloped[:, 2])),
                    scores=(float(fit.scores[g][0]), float(fit.scores[g][1])),
                    eff_n=(float(en0), *_quantiles(eff[:, 0])),
                    eff_d=(float(ed0), *_quantiles(eff[:, 1])),
                    trend=None if tr is None else tr.predict(params),
                    slope=None if tr is None else (tr.slope, tr.slope_se),
                    trend_changes=None if tr is None else tr.changes,
                )
            )
        out.append(preds)
    return out


@dataclass(frozen=True)
class Backtest:
    """The refit without the largest size against what that size measured."""

    config: str
    params: float
    ref_tokens: float
    predicted: float
    """The median of what the refit says the held-out size would measure (inside ``lo``-``hi``)."""
    lo: float
    hi: float
    measured: float
    side: str
    """"" when every pair of the largest size was measured; "at least" / "at most" when the
    measurement is a bound."""

    @property
    def covered(self) -> bool:
        if self.side == "at least":
            return self.hi >= self.measured
        if self.side == "at most":
            return self.lo <= self.measured
        return self.lo <= self.measured <= self.hi


def _measured(
    d: Design, log_y: np.ndarray, g: int, size: float, ref: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``log_y``: the geometric mean over seed pairs of configuration ``g``'s measured
    ratio at ``size`` (reference budget ``ref``), and whether any pair was a bound (its side:
    1 at least, -1 at most, 0 none)."""
    units = [(k, v) for k, v in d.units.items() if k[0] == size and 0 in v and g in v]
    logs = np.zeros(log_y.shape[0])
    side = np.zeros(log_y.shape[0])
    for _, v in units:
        b = v[0][d.tokens[v[0]] == ref]
        c = v[g]
        need, s = tokens_to_loss_many(d.tokens[c], np.exp(log_y[:, c]), np.exp(log_y[:, b[0]]))
        logs += np.log(need / ref)
        side = np.where(side != 0, side, s)
    return np.exp(logs / max(len(units), 1)), side


def _pool(d: Design, train: np.ndarray) -> list[tuple[float, object]]:
    """The runs (size, seed) whose residuals the bootstrap resamples: training sizes with every
    configuration."""
    return [k for k, v in d.units.items() if train[v[0]].all() and len(v) == len(d.groups)]


def _widened(err: np.ndarray, runs: int) -> tuple[float, float, float]:
    """The median of ``err`` and its 2.5% and 97.5% quantiles about it, widened by Student's t at
    ``runs`` - 1 degrees of freedom over the normal's: the noise's scale comes from a handful of
    runs, and a percentile interval of so few undercovers (simulated: 90% for a 95% interval with
    six runs; 93-95% widened)."""
    if len(err) == 0:
        return 0.0, -math.inf, math.inf
    med = float(np.median(err))
    lo, hi = np.quantile(err, [0.025, 0.975])
    k = t975(max(runs - 1, 1)) / 1.959964
    return med, med + k * (float(lo) - med), med + k * (float(hi) - med)


def backtest(
    frame: pd.DataFrame,
    baseline: str,
    *,
    tokens_per_param: float | None = None,
    boot: int = BOOT,
    seed: int = 0,
    model: str = PRIMARY,
) -> list[Backtest]:
    """Refit without the largest size; per configuration, the 95% interval for the ratio the
    largest size would measure (at its budget nearest ``tokens_per_param``) under ``model``, and
    what it did."""
    sizes = np.unique(check_frame(frame)["params"].to_numpy(float))
    if len(sizes) < 3:
        return []
    top = float(sizes[-1])
    fit = fit_ladder(frame, baseline, boot=boot, seed=seed, below=top, scored=False)
    d = fit.design
    train = d.params < top
    ref = reference_tokens(d.tokens[(d.group == 0) & ~train], top, tokens_per_param)
    out = []
    for cfg in fit.configs:
        g = d.groups.index(cfg)
        if not ((d.group == g) & ~train).any():
            continue
        pred0, pred = fit.ratios(cfg, top, ref, model)
        sim, _ = _measured(d, fit.log_reps, g, top, ref)
        err = np.log(sim) - np.log(pred)
        # the interval is for what the held-out size's measurement gives (its seed noise and the
        # interpolation between its budgets included), so its centre is the prediction's median
        # measurement, not Quartet's ratio itself
        mid_e, lo_e, hi_e = _widened(err[np.isfinite(err)], fit.runs)
        got, side = _measured(d, np.log(d.loss)[None], g, top, ref)
        out.append(
            Backtest(
                config=d.groups[g],
                params=top,
                ref_tokens=ref,
                predicted=pred0 * math.exp(mid_e) if math.isfinite(pred0) else math.inf,
                lo=pred0 * math.exp(lo_e) if math.isfinite(pred0) else math.inf,
                hi=pred0 * math.exp(hi_e) if math.isfinite(pred0) else math.inf,
                measured=float(got[0]),
                side={1: "at least", -1: "at most"}.get(int(side[0]), ""),
            )
        )
    return out


def ladder_table(
    frame: pd.DataFrame,
    baseline: str,
    params: float,
    tokens: float,
    *,
    boot: int = BOOT,
    seed: int = 0,
) -> tuple[pd.DataFrame, list[ConfigPrediction], list[Backtest]]:
    """``ladder.csv``'s rows (``LADDER_COLUMNS``: per configuration the prediction, then Quartet's
    constant penalty and the trend alone), with the predictions and back-tests they came from."""
    preds = predict(frame, baseline, params, tokens, boot=boot, seed=seed)
    tests = backtest(frame, baseline, tokens_per_param=tokens / params, boot=boot, seed=seed)
    return table_rows(preds, tests, params, tokens), preds, tests


def table_rows(
    preds: list[ConfigPrediction], tests: list[Backtest], params: float, tokens: float
) -> pd.DataFrame:
    """``ladder.csv``'s rows from predictions at (``params``, ``tokens``) and their back-tests."""
    covered = {b.config: b.covered for b in tests}
    rows = []
    for p in preds:
        common = {"config": p.config, "target_params": params, "target_tokens": tokens}
        bt = covered.get(p.config, "")
        readings = [(p.ratio, p.lo, p.hi, p.reachable), (*p.quartet, "")]
        if p.trend is not None:
            readings.append((*p.trend, ""))
        for method, (ratio, lo, hi, reach) in zip(METHODS, readings, strict=False):
            rows.append(
                {
                    **common,
                    "token_ratio": ratio,
                    "ratio_lo": lo,
                    "ratio_hi": hi,
                    "method": method,
                    "backtest_covered": bt if method == PRIMARY else "",
                    "reachable": reach,
                }
            )
    return pd.DataFrame(rows, columns=list(LADDER_COLUMNS))
