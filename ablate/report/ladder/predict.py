"""A ladder's prediction at the user's scale: each configuration's token ratio at a target (N*, D*)
with a 95% interval, a back-test, and the trend in N.

``predict`` fits Quartet's law on the baseline and each configuration's efficiencies
(``ablate.report.ladder.law``), and reads the token ratio at (N*, D*): the tokens the configuration
needs to reach the baseline's loss there, over D*. Its interval comes from a bootstrap over whole
runs, paired by seed: a run (one size and seed, every budget of it) of the baseline and the runs
of every configuration with the same size and seed move together. The bootstrap resamples runs'
residuals from the fit (each run's vector of log-loss residuals over its budgets, the baseline's
and the configurations' of one (size, seed) as one unit, scaled up for the parameters the fit
spent), adds them to the fitted losses, and refits everything: law, efficiencies and ratio, a
thousand times at once. Resampling residual units from the whole ladder rather than the two or
three seeds of one size is what lets two seeds give an interval that covers (a case bootstrap of
two seeds has three distinct outcomes per size); the simulation tests measure the coverage.

The model-free reading (``ablate.report.ladder.trend``) carries the measured ratios' line in log N
to N* with its own interval. The prediction reported is Quartet's; its interval is the hull of the
two intervals, so that it holds when either reading's assumptions do (``method`` "quartet+trend";
the two are also given alone).

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
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ablate.report.ladder.law import (
    Law,
    check_frame,
    fit_efficiencies,
    fit_laws,
    laws_from_x,
    start_grid,
    token_ratios,
)
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
METHODS = ("quartet+trend", "quartet", "trend")


@dataclass
class _Design:
    """The ladder's observations in one order: group 0 is the baseline, then the configurations."""

    groups: list[str]
    group: np.ndarray  # (M,) group index of each observation
    params: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    seed: np.ndarray
    units: dict[tuple[float, object], dict[int, np.ndarray]] = field(default_factory=dict)
    """(size, seed) -> group -> the indices of that run's observations, by budget."""


def _design(frame: pd.DataFrame, baseline: str) -> _Design:
    f = check_frame(frame)
    if baseline not in set(f["config"]):
        raise ValueError(f"ladder: the baseline {baseline!r} has no evaluations")
    groups = [baseline, *sorted(c for c in f["config"].unique() if c != baseline)]
    f = f.assign(_g=f["config"].map({g: i for i, g in enumerate(groups)}))
    f = f.sort_values(["_g", "params", "seed", "tokens"]).reset_index(drop=True)
    d = _Design(
        groups=groups,
        group=f["_g"].to_numpy(int),
        params=f["params"].to_numpy(float),
        tokens=f["tokens"].to_numpy(float),
        loss=f["val_loss"].to_numpy(float),
        seed=f["seed"].to_numpy(object),
    )
    for (g, n, s), idx in f.groupby(["_g", "params", "seed"]).groups.items():
        d.units.setdefault((float(n), s), {})[int(g)] = np.asarray(idx, dtype=int)
    return d


@dataclass
class _Fit:
    law_x: np.ndarray  # (K, 6) unbounded law parameters
    eff: dict[int, np.ndarray]  # group -> (K, 2)

    def log_fitted(self, d: _Design) -> np.ndarray:
        """log of the fitted loss of every observation (K, M)."""
        law = laws_from_x(self.law_x)
        out = np.empty((self.law_x.shape[0], len(d.loss)))
        for g in range(len(d.groups)):
            m = d.group == g
            en, ed = (1.0, 1.0) if g == 0 else (self.eff[g][:, :1], self.eff[g][:, 1:])
            cols = Law(*(np.asarray(getattr(law, f))[:, None] for f in _LAW_FIELDS))
            out[:, m] = np.log(cols.loss(d.params[m], d.tokens[m], en, ed))
        return out


_LAW_FIELDS = ("a", "alpha", "b", "beta", "gamma", "e")


def _fit(d: _Design, log_y: np.ndarray, train: np.ndarray, starts: np.ndarray) -> _Fit:
    """The law on the baseline's training observations and every configuration's efficiencies,
    for each row of ``log_y`` (K, M)."""
    base = train & (d.group == 0)
    x, _ = fit_laws(d.params[base], d.tokens[base], np.exp(log_y[:, base]), 1.0, starts)
    law = laws_from_x(x)
    eff = {}
    for g in range(1, len(d.groups)):
        m = train & (d.group == g)
        if m.any():
            eff[g] = fit_efficiencies(law, d.params[m], d.tokens[m], np.exp(log_y[:, m]), 1.0)
    return _Fit(x, eff)


def _replicates(
    d: _Design, point: _Fit, train: np.ndarray, boot: int, rng: np.random.Generator
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
    n_par = 6 + 2 * (len(d.groups) - 1)
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
    """One configuration's prediction at a target (see the module docstring)."""

    config: str
    ratio: float
    lo: float
    hi: float
    p_unreachable: float
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

    def hull(self) -> tuple[float, float]:
        if self.trend is None:
            return self.lo, self.hi
        return min(self.lo, self.trend[1]), max(self.hi, self.trend[2])


def _quantiles(v: np.ndarray) -> tuple[float, float]:
    s = np.where(np.isnan(v), np.inf, v)
    q = np.quantile(s, [0.025, 0.975], method="inverted_cdf")  # no interpolation with inf
    return float(q[0]), float(q[1])


def _ratios(fit: _Fit, g: int, params: float, tokens: float) -> np.ndarray:
    law = laws_from_x(fit.law_x)
    return token_ratios(law, fit.eff[g][:, 0], fit.eff[g][:, 1], params, tokens)


@dataclass
class LadderFit:
    """A ladder fitted: the point fit and its bootstrap replicates (``fit_ladder``)."""

    design: _Design
    point: _Fit
    reps: _Fit
    log_reps: np.ndarray
    """The replicates' log losses (boot, M)."""

    @property
    def configs(self) -> list[str]:
        """The configurations fitted (not the baseline)."""
        return [self.design.groups[g] for g in self.point.eff]

    def ratios(self, config: str, params: float, tokens: float) -> tuple[float, np.ndarray]:
        """The token ratio of ``config`` at (``params``, ``tokens``): the point fit's and the
        replicates'."""
        g = self.design.groups.index(config)
        return float(_ratios(self.point, g, params, tokens)[0]), _ratios(
            self.reps, g, params, tokens
        )

    def efficiency(self, config: str) -> tuple[np.ndarray, np.ndarray]:
        """(effN, effD) of ``config``: the point fit's (2,) and the replicates' (boot, 2)."""
        g = self.design.groups.index(config)
        return self.point.eff[g][0], self.reps.eff[g]

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
) -> LadderFit:
    """The law, every configuration's efficiencies and ``boot`` bootstrap refits of them all
    (see the module docstring); ``below``: fit only the sizes below it (a back-test)."""
    d = _design(frame, baseline)
    train = np.ones(len(d.loss), dtype=bool) if below is None else d.params < below
    base = train & (d.group == 0)
    if len(np.unique(d.params[base])) < 2 or len(np.unique(d.tokens[base])) < 2:
        raise ValueError(
            f"ladder: the baseline {baseline!r} needs at least two sizes and two budgets to fit "
            f"a law (has {len(np.unique(d.params[base]))} and {len(np.unique(d.tokens[base]))})"
        )
    grid = start_grid(float(d.loss[base].min()))
    point = _fit(d, np.log(d.loss)[None], train, grid)
    reps = _replicates(d, point, train, boot, np.random.default_rng(seed))
    # each replicate starts from the point fit: its data are the point fit's plus noise
    return LadderFit(d, point, _fit(d, reps, train, point.law_x), reps)


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
            r0, r = fit.ratios(cfg, params, tokens)
            lo, hi = _quantiles(r)
            tr = fit_trend(pairs, cfg)
            (en0, ed0), eff = fit.efficiency(cfg)
            preds.append(
                ConfigPrediction(
                    config=cfg,
                    ratio=r0,
                    lo=min(lo, r0),
                    hi=max(hi, r0),
                    p_unreachable=float(np.mean(~np.isfinite(r))),
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
    d: _Design, log_y: np.ndarray, g: int, size: float, ref: float
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


def _pool(d: _Design, train: np.ndarray) -> list[tuple[float, object]]:
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
) -> list[Backtest]:
    """Refit without the largest size; per configuration, the 95% interval for the ratio the
    largest size would measure (at its budget nearest ``tokens_per_param``), and what it did."""
    sizes = np.unique(check_frame(frame)["params"].to_numpy(float))
    if len(sizes) < 3:
        return []
    top = float(sizes[-1])
    fit = fit_ladder(frame, baseline, boot=boot, seed=seed, below=top)
    d = fit.design
    train = d.params < top
    ref = reference_tokens(d.tokens[(d.group == 0) & ~train], top, tokens_per_param)
    out = []
    for cfg in fit.configs:
        g = d.groups.index(cfg)
        if not ((d.group == g) & ~train).any():
            continue
        pred0, pred = fit.ratios(cfg, top, ref)
        sim, _ = _measured(d, fit.log_reps, g, top, ref)
        err = np.log(sim) - np.log(pred)
        # the interval is for what the held-out size's measurement gives (its seed noise and the
        # interpolation between its budgets included), so its centre is the prediction's median
        # measurement, not Quartet's ratio itself
        mid_e, lo_e, hi_e = _widened(err[np.isfinite(err)], len(_pool(d, train)))
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
    """``ladder.csv``'s rows (``LADDER_COLUMNS``: per configuration the combined prediction,
    then Quartet's and the trend's alone), with the predictions and back-tests they came from."""
    preds = predict(frame, baseline, params, tokens, boot=boot, seed=seed)
    tests = {
        b.config: b
        for b in backtest(frame, baseline, tokens_per_param=tokens / params, boot=boot, seed=seed)
    }
    rows = []
    for p in preds:
        bt = tests.get(p.config)
        covered = "" if bt is None else bt.covered
        lo, hi = p.hull()
        common = {"config": p.config, "target_params": params, "target_tokens": tokens}
        rows.append(
            {
                **common,
                "token_ratio": p.ratio,
                "ratio_lo": lo,
                "ratio_hi": hi,
                "method": METHODS[0],
                "backtest_covered": covered,
                "reachable": p.reachable,
            }
        )
        rows.append(
            {
                **common,
                "token_ratio": p.ratio,
                "ratio_lo": p.lo,
                "ratio_hi": p.hi,
                "method": METHODS[1],
                "backtest_covered": covered,
                "reachable": p.reachable,
            }
        )
        if p.trend is not None:
            rows.append(
                {
                    **common,
                    "token_ratio": p.trend[0],
                    "ratio_lo": p.trend[1],
                    "ratio_hi": p.trend[2],
                    "method": METHODS[2],
                    "backtest_covered": "",
                    "reachable": "yes",
                }
            )
    return pd.DataFrame(rows, columns=list(LADDER_COLUMNS)), preds, list(tests.values())
