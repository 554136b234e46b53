"""Named recipes: the published FP4 training recipes, each built from its source's description.

``named_recipe(name, base=...)`` returns one of ``NAMED_RECIPES`` as a ``Recipe``; a study writes it
``recipe: NAME`` (in ``base`` or as a grid axis), and ``ablate recipe NAME`` prints its table. Each
builder's docstring cites its source and says what these numerics approximate. Operands are named
by tensor (``x`` activations, ``w`` weights, ``dy`` output gradients; see ``recipe.OPERANDS``):

    recipe               fprop (x, w)           dgrad (dy, w)             wgrad (dy, x)
    nvidia_nvfp4         nvfp4, w 16x16         nvfp4, dy SR, w 16x16     nvfp4, dy SR, fixed RHT16
    tseng_mxfp4          base format            mxfp4 SR*3/4, RHT64       mxfp4 SR*3/4, RHT64
    amd_mxfp4_h16        mxfp4, H16             mxfp4, H16                mxfp4, H16
    quartet              mxfp4, H32             mxfp4 SR*3/4, RHT32       mxfp4 SR*3/4, RHT32
    four_over_six        nvfp4 4/6              nvfp4 4/6, dy SR*16/17    nvfp4 4/6, dy SR*16/17,
                                                                          fixed RHT16
    nvidia_nvfp4_4over6  nvfp4 4/6-MAE, w 16x16 nvfp4, dy SR, w as fprop  nvfp4, dy SR, x 4/6-MAE
    quartet_ii           nvfp4 4/6              nvfp4 MS-EDEN, RHT128     nvfp4 MS-EDEN, RHT128
    tetrajet_v2          nvfp4/o128             nvfp4/o128 SR, RHT16      nvfp4/o128 SR, RHT16

(RHT: Hadamard with random signs, redrawn every call unless "fixed"; H: deterministic Hadamard;
SR*3/4: stochastic rounding after the clip-free 3/4 prescale (16/17: fouroversix's unbiased SR);
4/6: Four Over Six block scales, error measure MSE unless named (``four_over_six.py``); MS-EDEN:
``ms_eden.py``; o128: an FP32 scale per 128 elements (``double_block.py``); the rest rounds to
nearest-even.)
Block selection (the first/last blocks in BF16, layer types, block indices) is the study's
``keep_first``/``keep_last``/``layers``, applied on top with ``Recipe.select``.
"""

from __future__ import annotations

from collections.abc import Callable

from backends.quant import QuantSpec, ScaleMode
from backends.recipes.recipe import BASE_FORMATS, GemmRecipe, HadamardSpec, Recipe, base_gemm

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
    ``fp4_gemms: [dgrad, wgrad], intervention: sr+rht64``.

    Every E2M1 code and E8M0 scale of the backward GEMMs equals the paper's code's
    (amazon-science/mxfp4-llm at 0cc57fe: its microxcaling ``dither_scale`` rounding and Megatron
    autograd Function, ``BW_USE_MXFP4=3``, ``HBS=64``) when both draw the same signs and uniforms
    (tested against a transcription, ``tests/backends/recipes/test_tseng_reference.py``). A
    faithful reproduction of the paper's runs differs from this recipe in what follows, none of it
    in the codes:

    - the draws: the signs and SR uniforms come from this project's counter-based streams (per
      layer, GEMM, operand and call), not from torch's global RNG (``torch.randn(64) > 0``,
      ``rand_like``); the same distribution, other numbers;
    - data parallelism: Megatron seeds torch's RNG alike on every data-parallel rank, so every rank
      draws the same signs and uniforms and the SR noise of wgrad does not average over ranks;
      ablate keys the per-rank streams by rank unless ``train.rank_draws: shared``;
    - the 4/3 compensation: the paper multiplies each element by ``2^(e + 2) / 3`` and stores it in
      bfloat16, so values with |q| in {0.5, 1, 2, 4} become x513/512 of the exact value (a bias of
      about +0.19% on dgrad and wgrad, measured by the test); ablate undoes 16/9 exactly on the
      float32 GEMM output;
    - the Hadamard transform: the paper multiplies bfloat16 operands by the bfloat16 matrix
      ``diag(s) H / 8`` and quantizes the product rounded to bfloat16; ablate rotates in float32;
    - the FP8-forward variant (``te1.5/linear.py``, ``base="fp8"`` here): the paper's wgrad
      re-quantizes the FP8-cast input to MXFP4 (``cast_from_fp8`` of the forward's FP8 copy);
      ablate's wgrad quantizes the high-precision input.
    """
    if base not in BASE_FORMATS:
        raise ValueError(f"base: unknown {base!r}; allowed: {', '.join(BASE_FORMATS)}")
    q = QuantSpec(format="mxfp4", scale_mode=ScaleMode.FLOOR, rounding="sr", prescale=True)
    rht = HadamardSpec(size=64, signs="random")
    back = GemmRecipe(a=q, b=q, hadamard=rht)
    return Recipe(
        fprop=base_gemm("fprop", base), dgrad=back, wgrad=back, label=f"tseng_mxfp4/{base}"
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


def four_over_six(base: str = "bf16") -> Recipe:
    """Four Over Six as its authors train with it: Cook et al., "Four Over Six: More Accurate NVFP4
    Quantization with Adaptive Block Scaling" (arXiv 2512.02010), mit-han-lab/fouroversix's
    training configuration ``scripts/train/configs/transformer_340M_nvfp4_fouroversix.json``
    (``scale_rule: mse``, ``gradient_round_style: stochastic_unbiased``) with the defaults of
    ``ModuleQuantizationConfig`` and the GEMMs of ``FourOverSixLinearFunction``
    (``src/fouroversix/model/modules/linear.py``). All three GEMMs in NVFP4, every operand with
    Four Over Six block scales chosen by MSE (``QuantSpec.scale_rule``):

    - activations and weights round to nearest, in 1x16 blocks (``weight_scale_2d`` is off in
      that configuration, so dgrad quantizes W^T along out_features on its own);
    - output gradients (dgrad and wgrad) round stochastically after fouroversix's 16/17 factor
      (``RoundStyle.stochastic_unbiased``: a block maximum can then never round past 6), undone
      on the GEMM output;
    - wgrad rotates both operands (dY^T and X^T) with a 16-point Hadamard transform and
      TransformerEngine's one sign vector (``get_rht_matrix``), as ``nvidia_nvfp4`` does.

    The configuration keeps its last 4 of 24 blocks in BF16: the study's ``keep_last``.
    Approximated: the 16/17 scales the values before rounding (fouroversix folds it into the
    tensor scale: the same values up to rounding, and the 4/6 choice compares the candidates
    with 16/17 of x instead); stochastic rounding draws from this project's stream, the same
    uniforms for both 4/6 candidates (as fouroversix's Triton kernel); the Hadamard transform is
    computed in float32 (fouroversix multiplies by a bfloat16 matrix). ``base`` is unused.
    """
    del base
    xw = QuantSpec(format="nvfp4", scale_rule="mse")
    dy = QuantSpec(format="nvfp4", scale_rule="mse", rounding="sr", prescale=16 / 17)
    rht = HadamardSpec(size=16, signs="fixed", vector=TE_WGRAD_SIGNS)
    return Recipe(
        fprop=GemmRecipe(a=xw, b=xw),
        dgrad=GemmRecipe(a=dy, b=xw),
        wgrad=GemmRecipe(a=dy, b=xw, hadamard=rht),
        label="four_over_six",
    )


def nvidia_nvfp4_4over6(base: str = "bf16") -> Recipe:
    """TransformerEngine's NVFP4 recipe with its 4over6 option on every tensor it allows:
    ``NVFP4BlockScaling(nvfp4_4over6="all", disable_rht=True)`` (TransformerEngine
    ``common/recipe/__init__.py``; quantizers made by ``NVFP4BlockScalingRecipeState`` in
    ``pytorch/quantization.py``; arithmetic in ``_quantize_blockwise_4over6_reference``). It
    differs from ``four_over_six``: TE applies 4/6 to activations and weights only (gradients keep
    standard NVFP4 with stochastic rounding), its default error measure is MAE, weights keep their
    16x16 tiles (one 4/6 choice per tile, W and W^T one quantization), and 4over6 refuses the
    random Hadamard transform, so the scope "all" needs ``disable_rht`` (nvidia_nvfp4's wgrad RHT
    is off here):

    - fprop: x 4/6-MAE 1x16, w 4/6-MAE 16x16, round to nearest;
    - dgrad: dy standard NVFP4 with stochastic rounding, w the same 16x16 quantization;
    - wgrad: dy as in dgrad, x 4/6-MAE 1x16 along tokens (the input quantizer's column-wise copy).

    TE's other scopes ("weights": 4/6 on w only, RHT kept) are partial overrides of
    ``nvidia_nvfp4`` (docs/recipes.md). Approximated: nothing in the GEMMs. ``base`` is unused.
    """
    del base
    x = QuantSpec(format="nvfp4", scale_rule="mae")
    w = QuantSpec(format="nvfp4", scale_rule="mae", block_rows=16)
    dy = QuantSpec(format="nvfp4", rounding="sr")
    return Recipe(
        fprop=GemmRecipe(a=x, b=w),
        dgrad=GemmRecipe(a=dy, b=w),
        wgrad=GemmRecipe(a=dy, b=x),
        label="nvidia_nvfp4_4over6",
    )


def quartet_ii(base: str = "bf16") -> Recipe:
    """Quartet II: Panferov et al., "Quartet II: Accurate LLM Pre-Training in NVFP4 by Improved
    Unbiased Gradient Estimation" (arXiv 2601.22813), as IST-DASLab/Quartet-II trains it
    (``src/models/quantization/schemes/quartet_2.py``, ``Quartet_II_fn``; its sweep
    ``scripts/quartetv2_sweep.sh`` sets the Hadamard size 128, and its kernels' linear layer turns
    4/6 on by default). All three GEMMs in NVFP4:

    - forward: x and w with Four Over Six block scales chosen by MSE, round to nearest, 1x16;
    - backward: every operand of dgrad (dY, W^T) and wgrad (dY^T, X^T) rotated by a 128-point
      Hadamard transform with signs redrawn at every backward pass, then MS-EDEN
      (``rounding: eden``): round to nearest, each rotation group's scale corrected and rounded
      stochastically into E4M3 (``ms_eden.py``).

    Approximated: (1) the forward's 4/6 follows fouroversix's arithmetic (Quartet II's Triton
    kernel divides where fouroversix multiplies by a reciprocal, rounds ties away from zero and
    replaces a zero block scale by 1: the same choices except near ties); (2) the backward quantizes the high-precision X and W
    where Quartet II re-quantizes the forward's quantized values; (3) Quartet II draws one sign
    vector per backward pass for every layer and both backward GEMMs, this recipe one per layer,
    GEMM and call; (4) its delayed-amax option (off in its runs) is not modelled. ``base`` is
    unused.
    """
    del base
    fwd = QuantSpec(format="nvfp4", scale_rule="mse")
    bwd = QuantSpec(format="nvfp4", rounding="eden")
    back = GemmRecipe(a=bwd, b=bwd, hadamard=HadamardSpec(size=128, signs="random"))
    return Recipe(fprop=GemmRecipe(a=fwd, b=fwd), dgrad=back, wgrad=back, label="quartet_ii")


def tetrajet_v2(base: str = "bf16") -> Recipe:
    """TetraJet-v2's NVFP4 linear recipe: Chen et al., "TetraJet-v2: Accurate NVFP4 Training for
    Large Language Models with Oscillation Suppression and Outlier Control" (arXiv 2510.27527),
    as thu-ml/TetraJet-v2-NVFP4Training trains it (``olmo2-training/configs/*/TJv2-base.yaml``:
    inner block 16, outer block 128, ``backward_stochastic``, ``hadamard_bwd`` for dX and dW;
    ``olmo/quantization_real/linear.py``, ``kernels/csrc/quant_fp4.cu``). Every operand in
    double-block NVFP4 (E4M3 scale per 16, FP32 scale per 128 along the reduction dimension:
    ``double_block.py``):

    - fprop: x (quantizer 1) and w (2) round to nearest, no Hadamard transform;
    - dgrad: dY (3) and W^T (4) rotated by a 16-point Hadamard transform with random signs (one
      draw per call, shared by the GEMM's two operands), stochastic rounding;
    - wgrad: dY^T (5) and X^T (6) likewise, with their own signs.

    Approximated: (1) quantizers 4 and 6 re-quantize the forward's dequantized W and X ("aligned
    activations"); here the backward quantizes the high-precision tensors; (2) stochastic rounding
    and signs come from this project's streams. Not a GEMM recipe, so not here: OsciReset (it
    watches FP4 weights oscillate between grid points during annealing and resets their master
    weights to the bin centres: optimizer state over steps) and OutControl's outlier-channel
    retention (a calibration picks 10% of X's channels, which then run through a separate MXFP8
    GEMM); its other half, the backward Hadamard transform, is in the recipe. ``TJv2-base`` is
    the configuration without either. The ``native`` backend refuses the outer scales (no GEMM
    here takes them). ``base`` is unused.
    """
    del base
    fwd = QuantSpec(format="nvfp4", outer_block=128)
    bwd = QuantSpec(format="nvfp4", outer_block=128, rounding="sr")
    back = GemmRecipe(a=bwd, b=bwd, hadamard=HadamardSpec(size=16, signs="random"))
    return Recipe(fprop=GemmRecipe(a=fwd, b=fwd), dgrad=back, wgrad=back, label="tetrajet_v2")


NAMED_RECIPES: dict[str, Callable[[str], Recipe]] = {
    "nvidia_nvfp4": nvidia_nvfp4,
    "tseng_mxfp4": tseng_mxfp4,
    "amd_mxfp4_h16": amd_mxfp4_h16,
    "quartet": quartet,
    "four_over_six": four_over_six,
    "nvidia_nvfp4_4over6": nvidia_nvfp4_4over6,
    "quartet_ii": quartet_ii,
    "tetrajet_v2": tetrajet_v2,
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
