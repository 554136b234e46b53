"""The NVFP4 quantizer variants of the 2026 recipes: their options, their checks, shared block set-up.

Three options of ``QuantSpec`` change how an NVFP4 operand is scaled or rounded; each has its own
module, its arithmetic transcribed from its source and tested against it bit for bit:

    option                 module            source
    scale_rule: mse|mae|abs_max
                           ``scale_rule``    Four Over Six (mit-han-lab/fouroversix; TransformerEngine's
                                             ``nvfp4_4over6``): per block, map the maximum to 6 or to 4
    rounding: eden         ``eden``          MS-EDEN of Quartet II (IST-DASLab/Quartet-II): round to
                                             nearest, then correct each Hadamard group's scale and
                                             round the corrected scale stochastically into E4M3
    outer_block: N         ``outer_block``   TetraJet-v2's double-block NVFP4: an FP32 scale per N
                                             elements (128) instead of one per tensor

Fast path: none of them is in the C kernel of ``ckernel.py``. ``quantizer.quantize`` and
``quantizer.fake_quantize`` send them to the torch path of ``torch_path.py`` (``torch_path.call`` with the
module's ``run``) on every device: eager on the CPU (slower than the kernel: a 4/6 operand is
quantized twice and its errors compared), compiled by ``torch.compile`` on CUDA, and traced into a
compiled model like the rest of the quantizer.

This module holds what the three share as options, in plain Python (a study checks them without
torch): the vocabulary and ``check`` (called by ``QuantSpec``). The padding, blocks and maxima
every quantizer starts from are ``blocks.py``'s.
"""

from __future__ import annotations

from typing import Any

SCALE_RULES = ("mse", "mae", "abs_max")
"""Four Over Six's error measures: sum of squared errors, sum of absolute errors, largest error."""
ROUNDINGS = ("rne", "sr", "eden")
SCALE_PICKS = ("rounded", "nearest")
"""How Four Over Six compares its two candidate scales: as each rounds (under stochastic rounding
with the same draws, as the published recipes do: biased), or as each rounds to nearest, the
chosen scale then rounding stochastically (unbiased)."""
OUTER_BLOCKS = (32, 64, 128, 256, 512, 1024)
FOUR_OVER_SIX_TOP = 1536.0
"""6 * 256: the value Four Over Six maps the tensor amax to (E2M1's 6 times the 4/6 E4M3 bound
256; ``four_over_six.TOP``)."""


def check(spec: Any) -> None:
    """Raise ValueError (starting with the field's name) unless the variant options of ``spec``
    (a ``operand.QuantSpec``) fit its format and each other."""
    fmt = spec.format
    if spec.scale_rule is not None:
        if spec.scale_rule not in SCALE_RULES:
            raise ValueError(
                f"scale_rule: unknown {spec.scale_rule!r}; allowed: {', '.join(SCALE_RULES)} "
                "(Four Over Six), or leave it out for the format's own scale"
            )
        if fmt != "nvfp4":
            raise ValueError(
                f"scale_rule: Four Over Six needs E4M3 block scales (nvfp4), not {fmt}: a "
                "power-of-two scale cannot take map-to-4's factor 1.5; allowed format: nvfp4"
            )
    if spec.scale_pick != "rounded":
        if spec.scale_pick not in SCALE_PICKS:
            raise ValueError(
                f"scale_pick: unknown {spec.scale_pick!r}; allowed: {', '.join(SCALE_PICKS)}"
            )
        if spec.scale_rule is None:
            raise ValueError(
                "scale_pick: chooses between Four Over Six's two scales, so it needs a "
                "scale_rule (mse, mae, abs_max); leave it out without one"
            )
    if spec.rounding == "eden":
        if fmt != "nvfp4":
            raise ValueError(
                f"rounding: eden (MS-EDEN) rounds E4M3 block scales (nvfp4), not {fmt}; allowed "
                "for it: rne, sr"
            )
        clash = [
            k
            for k, v in (
                ("scale_rule", spec.scale_rule),
                ("outer_block", spec.outer_block),
                ("prescale", spec.prescale),
                ("block_size", spec.block_size not in (None, 16)),
                ("block_rows", spec.block_rows != 1),
            )
            if v
        ]
        if clash:
            raise ValueError(
                f"rounding: eden (MS-EDEN, Quartet II's 1x16 blocks with its own headroom) takes no "
                f"{', '.join(clash)}; leave {'it' if len(clash) == 1 else 'them'} out"
            )
    if spec.outer_block is not None:
        if fmt != "nvfp4":
            raise ValueError(
                f"outer_block: an FP32 scale per block of blocks is an nvfp4 option, not {fmt}'s"
            )
        if spec.outer_block not in OUTER_BLOCKS or spec.outer_block % spec.block:
            raise ValueError(
                f"outer_block: {spec.outer_block} is not allowed with blocks of {spec.block}; "
                f"allowed: {', '.join(str(n) for n in OUTER_BLOCKS if n % spec.block == 0)} "
                "(a multiple of the block)"
            )
        if spec.block_rows != 1 or spec.scale_rule is not None:
            raise ValueError(
                "outer_block: double-block scales take 1-D blocks and the format's own scale "
                "(no block_rows, no scale_rule)"
            )


def prescale_factor(prescale: bool | float) -> float:
    """What ``QuantSpec.prescale`` multiplies the scaled values by: 3/4 for True (Tseng et al.),
    1 for False, else the factor itself (16/17: fouroversix's unbiased stochastic rounding)."""
    if prescale is True:
        return 0.75
    if prescale is False:
        return 1.0
    return float(prescale)


def check_prescale(prescale: Any) -> bool | float:
    """``prescale`` as ``QuantSpec`` keeps it: a bool, or a float in (0, 1) (0.75 is True, 1 is
    False, so one factor has one spelling); ValueError otherwise."""
    if isinstance(prescale, bool):
        return prescale
    try:
        f = float(prescale)
    except (TypeError, ValueError):
        f = float("nan")
    if not 0 < f <= 1:
        raise ValueError(
            f"prescale: {prescale!r} is not allowed; allowed: true (3/4), false, or a factor in "
            "(0, 1] such as 0.9411764705882353 (16/17)"
        )
    return True if f == 0.75 else False if f == 1.0 else f


__all__ = [
    "OUTER_BLOCKS",
    "ROUNDINGS",
    "SCALE_PICKS",
    "SCALE_RULES",
    "FOUR_OVER_SIX_TOP",
    "check",
    "check_prescale",
    "prescale_factor",
]
