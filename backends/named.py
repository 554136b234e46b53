"""Named recipes: the published FP4 training recipes, each built from its source's description.

``named_recipe(name, base=...)`` returns one of ``NAMED_RECIPES`` as a ``Recipe``; a study writes it
``recipe: NAME`` (in ``base`` or as a grid axis), and ``ablate recipe NAME`` prints its table. Each
builder's docstring cites its source and says what these numerics approximate. Operands are named
by tensor (``x`` activations, ``w`` weights, ``dy`` output gradients; see ``recipe.OPERANDS``):

    recipe          fprop (x, w)              dgrad (dy, w)               wgrad (dy, x)
    nvidia_nvfp4    nvfp4, w 16x16            nvfp4, dy SR, w 16x16       nvfp4, dy SR, fixed RHT16
    tseng_mxfp4     base format               mxfp4 SR*3/4, RHT64         mxfp4 SR*3/4, RHT64
    amd_mxfp4_h16   mxfp4, H16                mxfp4, H16                  mxfp4, H16
    quartet         mxfp4, H32                mxfp4 SR*3/4, RHT32         mxfp4 SR*3/4, RHT32

(RHT: Hadamard with random signs, redrawn every call unless "fixed"; H: deterministic Hadamard;
SR*3/4: stochastic rounding after the clip-free 3/4 prescale; the rest rounds to nearest-even.)
Block selection (the first/last blocks in BF16, layer types, block indices) is the study's
``keep_first``/``keep_last``/``layers``, applied on top with ``Recipe.select``.
"""

from __future__ import annotations

from collections.abc import Callable

from .formats import ScaleMode
from .quant import QuantSpec
from .recipe import BASE_FORMATS, GemmRecipe, HadamardSpec, Recipe, _base_gemm

TE_WGRAD_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
"""The sign vector TransformerEngine hard-codes for the NVFP4 wgrad RHT (``get_wgrad_sign_vector``
in ``transformer_engine/pytorch/tensor/nvfp4_tensor.py``)."""


def nvidia_nvfp4(base: str = "bf16") -> Recipe:
    """NVIDIA's NVFP4 training recipe: TransformerEngine's ``NVFP4BlockScaling`` (``transformer_engine/
    common/recipe/__init__.py``) as described in "Pretraining Large Language Models with NVFP4"
    (NVIDIA, arXiv 2509.25149) and TE's NVFP4 documentation.

    All three GEMMs in NVFP4 (E2M1, E4M3 scale per 16 elements, FP32 tensor scale):

    - ``fp4_quant_fwd_inp``: activations 1x16, round-to-nearest, RHT on the column-wise (wgrad)
      copy only;
    - ``fp4_quant_fwd_weight``: weights in 2-D 16x16 blocks (``fp4_2d_quantization``), so fprop's W
      and dgrad's W^T are one quantization; round-to-nearest, no RHT;
    - ``fp4_quant_bwd_grad``: output gradients 1x16 with stochastic rounding (dgrad and wgrad), RHT
      on the column-wise (wgrad) copy;
    - the RHT is 16-point with TE's one fixed sign vector (``TE_WGRAD_SIGNS``) for every layer and
      step, so only wgrad is rotated, both its operands (dY^T and X^T);
    - no clip-free prescale: SR rounds the scaled values as they are.

    The paper keeps a few blocks in BF16 (the last ones matter most); that number is the study's
    ``keep_last`` (``keep_first`` likewise). Approximated: nothing in the GEMMs; TE's global amax
    reductions across data-parallel ranks do not arise on one device. ``base`` is unused (every GEMM
    is NVFP4).
    """
    del base
    x = QuantSpec(format="nvfp4")
    w = QuantSpec(format="nvfp4", block_rows=16)
    dy = QuantSpec(format="nvfp4", rounding="sr")
    rht = HadamardSpec(size=16, signs="fixed", vector=TE_WGRAD_SIGNS)
    return Recipe(
        fprop=GemmRecipe(a=x, b=w),
        dgrad=GemmRecipe(a=dy, b=w),
        wgrad=GemmRecipe(a=dy, b=x, hadamard=rht),
        label="nvidia_nvfp4",
    )


def tseng_mxfp4(base: str = "bf16") -> Recipe:
    """Tseng, Yu, Park, "Training LLMs with MXFP4" (AISTATS 2025, arXiv 2502.20586).

    The forward GEMM stays in the base format (the paper: BF16); the backward GEMMs (dgrad, wgrad)
    run in MXFP4 (OCP: E8M0 scale per 32, floor rule) with stochastic rounding of both operands
    after the 3/4 prescale that keeps the block maximum from clipping (undone on the GEMM output,
    16/9), and a random Hadamard transform of 64 points with signs redrawn at every call, applied
    to both operands along the reduction dimension. The same as the shorthand
    ``fp4_gemms: [dgrad, wgrad], intervention: sr+rht64``. Approximated: the random signs come
    from this project's counter-based stream (per layer, GEMM and step), not the paper's RNG.
    """
    if base not in BASE_FORMATS:
        raise ValueError(f"base: unknown {base!r}; allowed: {', '.join(BASE_FORMATS)}")
    q = QuantSpec(format="mxfp4", scale_mode=ScaleMode.FLOOR, rounding="sr", prescale=True)
    rht = HadamardSpec(size=64, signs="random")
    back = GemmRecipe(a=q, b=q, hadamard=rht)
    return Recipe(
        fprop=_base_gemm("fprop", base), dgrad=back, wgrad=back, label=f"tseng_mxfp4/{base}"
    )


def amd_mxfp4_h16(base: str = "fp8") -> Recipe:
    """The stabilised recipe of "Pretraining LLMs with MXFP4 on Native FP4 Hardware" (AMD MI355X,
    arXiv 2605.09825), the MXFP4 option of ROCm TransformerEngine: MXFP4 (OCP, floor rule) on
    fprop, dgrad and wgrad over an FP8 baseline, a deterministic 16-point Hadamard transform (no
    signs) on both operands of every FP4 GEMM, round-to-nearest-even, no prescale. The same as the
    shorthand ``fp4_gemms: [fprop, dgrad, wgrad], intervention: dht16, base_format: fp8``. The FP8
    base covers what is not an FP4 GEMM (here nothing: every linear GEMM is MXFP4); ``base`` is
    unused. Approximated: nothing in the GEMMs.
    """
    del base
    q = QuantSpec(format="mxfp4", scale_mode=ScaleMode.FLOOR)
    g = GemmRecipe(a=q, b=q, hadamard=HadamardSpec(size=16, signs="none"))
    return Recipe(fprop=g, dgrad=g, wgrad=g, label="amd_mxfp4_h16")


def quartet(base: str = "bf16") -> Recipe:
    """IST-DASLab's Quartet, "Quartet: Native FP4 Training Can Be Optimal for Large Language Models"
    (Castro et al., NeurIPS 2025, arXiv 2505.14669), as its training code configures it
    (github.com/IST-DASLab/Quartet, ``main_setup.sh``): all three GEMMs in MXFP4.

    - Forward (``QuestMXFP4Quantizer`` for x and w): a fixed 32-point Hadamard transform (no signs)
      then round-to-nearest; here MXFP4 RNE after a deterministic H32 on both fprop operands.
    - Backward (``AlbertTsengQuantizer(stochastic=True, rerotate="signs")`` with the scheme
      ``Q(E)Q(Wt)t_Q(Et)Q(Xt)t``: every operand of dgrad and wgrad quantized): a 32-point Hadamard
      whose signs are redrawn at every backward pass, then stochastic rounding after the 3/4
      prescale (``gaussian_scale=3/4``) with the floor shared exponent; here MXFP4 SR*3/4 with a
      random H32 on both operands of dgrad and wgrad.

    Approximated: (1) QuEST's forward scale, chosen from the block's RMS (2.92 standard deviations)
    with the clipped elements masked out of the gradient (its "trust" mask), is replaced by the
    OCP absmax scale without a mask; (2) the backward quantizes the high-precision X and W where
    Quartet re-quantizes the forward's quantized values; (3) Quartet draws one sign vector per
    backward pass for dgrad and wgrad together, this recipe one per GEMM. The issue that asked for
    this recipe described Quartet's backward as round-to-nearest; its code rounds stochastically,
    which is what this follows. ``base`` is unused.
    """
    del base
    fwd = QuantSpec(format="mxfp4", scale_mode=ScaleMode.FLOOR)
    bwd = QuantSpec(format="mxfp4", scale_mode=ScaleMode.FLOOR, rounding="sr", prescale=True)
    back = GemmRecipe(a=bwd, b=bwd, hadamard=HadamardSpec(size=32, signs="random"))
    return Recipe(
        fprop=GemmRecipe(a=fwd, b=fwd, hadamard=HadamardSpec(size=32, signs="none")),
        dgrad=back,
        wgrad=back,
        label="quartet",
    )


NAMED_RECIPES: dict[str, Callable[[str], Recipe]] = {
    "nvidia_nvfp4": nvidia_nvfp4,
    "tseng_mxfp4": tseng_mxfp4,
    "amd_mxfp4_h16": amd_mxfp4_h16,
    "quartet": quartet,
}
"""Name -> builder taking the base format (used only where a recipe leaves a GEMM unquantized)."""
USES_BASE = frozenset({"tseng_mxfp4"})
"""Named recipes whose numerics depend on the base format."""


def named_recipe(name: str, base: str = "bf16") -> Recipe:
    """The named recipe ``name`` (``NAMED_RECIPES``) over ``base``; ValueError naming the allowed
    names otherwise."""
    try:
        build = NAMED_RECIPES[name]
    except KeyError:
        raise ValueError(f"recipe: unknown {name!r}; allowed: {', '.join(NAMED_RECIPES)}") from None
    return build(base)


__all__ = ["NAMED_RECIPES", "TE_WGRAD_SIGNS", "USES_BASE", "named_recipe"]
