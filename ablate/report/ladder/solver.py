"""A batched Levenberg-Marquardt solver for small robust curve fits (the ladder's laws).

``solve`` minimizes, for K independent problems at once, the weighted Huber loss of residuals
``r = f(x) - y`` over a few parameters ``x``, given a function that returns the model's values and
their Jacobian. The K problems share the code path, not the data: several starts of one fit, or
one fit per bootstrap replicate, run as one batch of NumPy operations (a bootstrap of a thousand
refits costs about as much as a few dozen single fits). Huber's loss is handled by iteratively
reweighted least squares: a residual beyond ``delta`` gets weight ``delta / |r|``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Model = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``x (K, P) -> (f (K, M), J (K, M, P))``: the model's values and their Jacobian."""


def huber(r: np.ndarray, delta: float, w: np.ndarray) -> np.ndarray:
    """Per problem: sum of ``w`` times Huber's loss of the residuals ``r`` (K, M) -> (K,)."""
    a = np.abs(r)
    loss = np.where(a <= delta, 0.5 * r**2, delta * (a - 0.5 * delta))
    loss = np.where(np.isfinite(loss), loss, np.inf)
    return np.where(w > 0, loss * w, 0.0).sum(axis=1)


def solve(
    model: Model,
    x0: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    *,
    delta: float,
    iters: int = 200,
    tol: float = 1e-10,
) -> tuple[np.ndarray, np.ndarray]:
    """Minimize each problem's ``huber(f(x) - y, delta, w)`` from ``x0`` (K, P); ``y`` and ``w``
    are (K, M) or (M,). Returns (x, loss) per problem: (K, P) and (K,)."""
    x = np.array(x0, dtype=float)
    k, p = x.shape
    y = np.broadcast_to(np.asarray(y, dtype=float), (k, *np.shape(y)[-1:]))
    w = np.broadcast_to(np.asarray(w, dtype=float), y.shape)
    f, jac = model(x)
    loss = huber(f - y, delta, w)
    lam = np.full(k, 1e-3)
    eye = np.eye(p)
    live = np.flatnonzero(np.isfinite(loss))  # the problems still improving
    for _ in range(iters):
        if live.size == 0:
            break
        r = f[live] - y[live]
        a = np.abs(r)
        omega = w[live] * np.where(a <= delta, 1.0, delta / np.maximum(a, 1e-300))
        ok = np.isfinite(r)
        omega, r = np.where(ok, omega, 0.0), np.where(ok, r, 0.0)
        jl = jac[live]
        jw = jl * omega[..., None]
        jwt = jw.transpose(0, 2, 1)
        h = jwt @ jl
        g = (jwt @ r[..., None])[..., 0]
        step = np.linalg.solve(h + lam[live, None, None] * (h * eye + 1e-9 * eye), -g[..., None])
        step = np.where(np.isfinite(step[..., 0]), step[..., 0], 0.0)
        x_new = x[live] + step
        f_new, jac_new = model_at(model, x_new, live)
        loss_new = huber(f_new - y[live], delta, w[live])
        better = loss_new < loss[live]
        gain = np.where(better, loss[live] - loss_new, 0.0)
        take = live[better]
        x[take], f[take], jac[take] = x_new[better], f_new[better], jac_new[better]
        loss[take] = loss_new[better]
        lam[live] = np.where(better, np.maximum(lam[live] / 3, 1e-12), lam[live] * 4)
        done = (better & (gain <= tol * np.maximum(loss[live], 1e-30))) | (lam[live] >= 1e12)
        live = live[~done]
    return x, loss


def model_at(model: Model, x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``model`` at ``x`` for the problems ``rows`` of the batch: a model whose data differ per
    problem takes ``rows`` (``Model`` with an attribute ``rows``); one whose data are shared does
    not need them."""
    sub = getattr(model, "subset", None)
    return (sub(rows) if sub is not None else model)(x)


def squash(x: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """A bounded parameter ``lo + (hi - lo) * sigmoid(x)`` and its derivative in ``x``."""
    s = 1.0 / (1.0 + np.exp(-np.clip(x, -60.0, 60.0)))
    return lo + (hi - lo) * s, (hi - lo) * s * (1.0 - s)


def unsquash(v: np.ndarray | float, lo: float, hi: float) -> np.ndarray:
    """The ``x`` that ``squash`` maps to ``v`` (kept strictly inside the bounds)."""
    p = np.clip((np.asarray(v, dtype=float) - lo) / (hi - lo), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))
