"""How biased a random quantizer is, element by element: ``python -m ablate.bench.bias``.

Stochastic rounding is meant to be unbiased: over independent draws, the mean of ``q(x)`` is ``x``
(times the spec's prescale, which the GEMM undoes). ``sr_bias`` quantizes one tensor under
``draws`` keys and returns each element's t statistic, ``(mean - target) / (sd / sqrt(draws))``;
an element whose draws never differ has no t (NaN). Under unbiased rounding the t statistics are
about standard normal, so with 8,192 elements one beyond 5 is expected in fewer than one run in a
hundred; a spec whose choices depend on the draws (Four Over Six comparing its candidates as they
round stochastically) shows many.

The command measures, on a randn (64, 128) tensor and 1,000 draws: NVFP4 SR after 16/17 (plain
NVFP4 SR clips where a block's E4M3 scale rounds down, a bias of its own), the
``four_over_six`` recipe's output-gradient spec (4/6-MSE, SR after 16/17) with ``scale_pick:
rounded`` (the recipe's) and with ``scale_pick: nearest``; it prints the count of elements with
|t| > 5 and the largest |t| (``--json`` for a machine).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace

import torch

from backends.quant import QuantSpec, fake_quantize
from backends.quant.rng import derive_key

DRAWS = 1000
SHAPE = (64, 128)


def sr_bias(spec: QuantSpec, x: torch.Tensor, draws: int = DRAWS, seed: int = 0) -> torch.Tensor:
    """Each element's t statistic of ``fake_quantize(x, spec)`` over ``draws`` keys against its
    expectation ``x * spec.prescale_factor`` (NaN where every draw gave the same value)."""
    target = x.double() * spec.prescale_factor
    v = torch.stack(
        [
            fake_quantize(x, spec, key=derive_key(seed, 7, i), out_dtype=torch.float32).double()
            for i in range(draws)
        ]
    )  # (draws, *x.shape)
    mean = v.mean(0)
    se = v.std(0) / math.sqrt(draws)  # two passes: no cancellation
    constant = (v == v[0]).all(0)
    return torch.where(constant, torch.nan, (mean - target) / se)


def summary(t: torch.Tensor, bound: float = 5.0) -> dict[str, float]:
    """Elements, those with a t, those beyond ``bound``, and the largest |t|."""
    finite = t[~t.isnan()]
    return {
        "elements": t.numel(),
        "random": int(finite.numel()),
        "beyond": int((finite.abs() > bound).sum()),
        "max_abs_t": float(finite.abs().max()) if finite.numel() else math.nan,
    }


def specs() -> dict[str, QuantSpec]:
    """What the command measures."""
    dy = QuantSpec(format="nvfp4", scale_rule="mse", rounding="sr", prescale=16 / 17)
    return {
        "nvfp4 SR*16/17": QuantSpec(format="nvfp4", rounding="sr", prescale=16 / 17),
        "four_over_six dy (scale_pick rounded)": dy,
        "four_over_six dy (scale_pick nearest)": replace(dy, scale_pick="nearest"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ablate.bench.bias", description=__doc__)
    ap.add_argument("--draws", type=int, default=DRAWS)
    ap.add_argument("--seed", type=int, default=0, help="seed of the randn input")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    x = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(args.seed))
    rows = {name: summary(sr_bias(s, x, args.draws)) for name, s in specs().items()}
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"randn {SHAPE}, {args.draws} draws; t of each element's mean against its expectation")
    print(f"{'spec':40} {'elements':>9} {'|t| > 5':>8} {'max |t|':>8}")
    for name, r in rows.items():
        print(f"{name:40} {r['elements']:>9} {r['beyond']:>8} {r['max_abs_t']:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
