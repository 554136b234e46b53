"""backends: the numerics of ablate, usable on their own (they import only torch).

Four rooms, each with its own face:

- ``backends.quant``: formats and the quantizer (a C kernel on the CPU, compiled torch arithmetic
  on GPUs, a readable reference every path equals bit for bit), Hadamard transforms, random streams;
- ``backends.recipes``: per-GEMM, per-operand recipes, and the published ones by name;
- ``backends.gemm``: the GEMM backends (``emulated`` on any device, ``native`` on the hardware's
  scaled GEMMs) and which device runs which format;
- ``backends.layer``: the quantized linear layer, model conversion and gradient-fidelity probes.

Typical use::

    from backends import Recipe, convert
    convert(model, Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], "dht", base="fp8"))

The benchmark of the quantizers and GEMMs is ``python -m ablate.bench.numerics``.
"""

from backends.gemm import (
    GemmBackend,
    UnsupportedFormatError,
    available_backends,
    get_backend,
    register_backend,
)
from backends.layer import (
    ARCHITECTURES,
    QuantLinear,
    UnknownArchitectureError,
    convert,
    convert_model,
)
from backends.quant import (
    E2M1,
    E4M3,
    E5M2,
    FORMATS,
    ElementFormat,
    QTensor,
    QuantSpec,
    ScaleMode,
    fake_quantize,
    fake_quantize_reference,
    hadamard_matrix,
    hadamard_transform,
    pack_fp4,
    quantize,
    quantize_reference,
    sign_vector,
    unpack_fp4,
)
from backends.recipes import (
    GEMMS,
    NAMED_RECIPES,
    GemmRecipe,
    HadamardSpec,
    Recipe,
    named_recipe,
    parse_intervention,
)

__all__ = [
    "ARCHITECTURES",
    "E2M1",
    "E4M3",
    "E5M2",
    "FORMATS",
    "GEMMS",
    "NAMED_RECIPES",
    "ElementFormat",
    "GemmBackend",
    "GemmRecipe",
    "HadamardSpec",
    "QTensor",
    "QuantLinear",
    "QuantSpec",
    "Recipe",
    "ScaleMode",
    "UnknownArchitectureError",
    "UnsupportedFormatError",
    "available_backends",
    "convert",
    "convert_model",
    "fake_quantize",
    "fake_quantize_reference",
    "get_backend",
    "hadamard_matrix",
    "hadamard_transform",
    "named_recipe",
    "pack_fp4",
    "parse_intervention",
    "quantize",
    "quantize_reference",
    "register_backend",
    "sign_vector",
    "unpack_fp4",
]
