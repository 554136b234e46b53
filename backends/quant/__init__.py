"""The quantizer: a GEMM operand to the codes and scales of a low-precision format, along its
reduction dimension, bit for bit what the hardware's conversion gives.

    from backends.quant import QuantSpec, quantize, fake_quantize
    q = quantize(x, QuantSpec(format="mxfp4"), axis=-1)  # codes + E8M0 scales (a QTensor)
    x_hat = fake_quantize(x, QuantSpec(format="nvfp4", rounding="sr"), key=7)  # the values only

The rules are written once, at the top of ``quantizer.py``; the paths that implement them are held
bit-identical by the tests:

- ``quantizer``: the entry points, which run the C kernel (``ckernel``, ``csrc/quant.c``) on the
  CPU and the branch-free torch arithmetic (``torch_path``, compiled on CUDA) elsewhere;
- ``reference``: the specification, slow and readable, every path is tested against;
- ``ops``: the same quantizer as opaque custom ops, for models ``torch.compile`` traces;
- ``variants``: the NVFP4 options of the 2026 recipes, each in its module (``four_over_six``,
  ``ms_eden``, ``double_block``), and ``blocks``, the blocks every torch path starts from;
- ``operand``: what a quantized operand is (``QuantSpec``, ``FORMATS``) and ``qtensor`` the result
  (``QTensor``); ``formats``: element and scale formats bit by bit; ``arith``: the float32
  constants and helpers the torch paths share; ``rotation``: what a Hadamard transform is and
  ``hadamard`` the block transforms; ``rng``: the counter-based random streams.

What a study names and checks is plain Python (``formats``, ``operand``, ``variants``,
``rotation``): this ``__init__`` loads its modules on first attribute access, so a study imports
its operands' vocabulary without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.lazy import lazy_getattr

if TYPE_CHECKING:
    from backends.quant.formats import (
        E2M1,
        E4M3,
        E5M2,
        ElementFormat,
        ScaleMode,
        decode_e8m0,
        pack_fp4,
        unpack_fp4,
    )
    from backends.quant.hadamard import (
        hadamard_matrix,
        hadamard_transform,
        hadamard_transform_reference,
        sign_vector,
    )
    from backends.quant.operand import BLOCK_SIZES, FORMATS, PRESCALE, BlockFormat, QuantSpec
    from backends.quant.qtensor import QTensor, nv_alpha, nv_decode
    from backends.quant.quantizer import (
        fake_quantize,
        fake_quantize_fused,
        quantize,
        quantize_fused,
    )
    from backends.quant.reference import fake_quantize_reference, quantize_reference
    from backends.quant.rotation import DETERMINISTIC, SIGN_POLICIES, SIZES, Rotation, SignPolicy

_LAZY = {
    **dict.fromkeys(
        ("E2M1", "E4M3", "E5M2", "ElementFormat", "ScaleMode", "decode_e8m0", "pack_fp4",
         "unpack_fp4"),
        "backends.quant.formats",
    ),
    **dict.fromkeys(
        ("hadamard_matrix", "hadamard_transform", "hadamard_transform_reference", "sign_vector"),
        "backends.quant.hadamard",
    ),
    **dict.fromkeys(
        ("BLOCK_SIZES", "FORMATS", "PRESCALE", "BlockFormat", "QuantSpec"),
        "backends.quant.operand",
    ),
    **dict.fromkeys(("QTensor", "nv_alpha", "nv_decode"), "backends.quant.qtensor"),
    **dict.fromkeys(
        ("fake_quantize", "fake_quantize_fused", "quantize", "quantize_fused"),
        "backends.quant.quantizer",
    ),
    **dict.fromkeys(
        ("fake_quantize_reference", "quantize_reference"), "backends.quant.reference"
    ),
    **dict.fromkeys(
        ("DETERMINISTIC", "SIGN_POLICIES", "SIZES", "Rotation", "SignPolicy"),
        "backends.quant.rotation",
    ),
}  # fmt: skip

__all__ = [
    "BLOCK_SIZES",
    "DETERMINISTIC",
    "E2M1",
    "E4M3",
    "E5M2",
    "FORMATS",
    "PRESCALE",
    "SIGN_POLICIES",
    "SIZES",
    "Rotation",
    "BlockFormat",
    "ElementFormat",
    "QTensor",
    "QuantSpec",
    "ScaleMode",
    "SignPolicy",
    "decode_e8m0",
    "fake_quantize",
    "fake_quantize_fused",
    "fake_quantize_reference",
    "hadamard_matrix",
    "hadamard_transform",
    "hadamard_transform_reference",
    "nv_alpha",
    "nv_decode",
    "pack_fp4",
    "quantize",
    "quantize_fused",
    "quantize_reference",
    "sign_vector",
    "unpack_fp4",
]


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
    __getattr__ = lazy_getattr(__name__, _LAZY)
