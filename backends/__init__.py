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

This ``__init__`` loads its rooms on first attribute access (``from backends import Recipe`` loads
``backends.recipes`` then), so a torch-free module such as ``backends.recipes.intervention`` (the
grammar the report reads labels with) imports without torch. ``lazy`` is not a room: it makes the
``__getattr__`` this index and every other index of ablate and backends that loads on first use
binds. Nor is ``env``: how the rooms read the ``ABLATE_*`` variables they share (the cache folder,
and the switches, each refused when set to a value it does not allow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.lazy import lazy_getattr

if TYPE_CHECKING:
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
        Intervention,
        Recipe,
        named_recipe,
    )

_LAZY = {
    "GemmBackend": "backends.gemm",
    "UnsupportedFormatError": "backends.gemm",
    "available_backends": "backends.gemm",
    "get_backend": "backends.gemm",
    "register_backend": "backends.gemm",
    "ARCHITECTURES": "backends.layer",
    "QuantLinear": "backends.layer",
    "UnknownArchitectureError": "backends.layer",
    "convert": "backends.layer",
    "convert_model": "backends.layer",
    "E2M1": "backends.quant",
    "E4M3": "backends.quant",
    "E5M2": "backends.quant",
    "FORMATS": "backends.quant",
    "ElementFormat": "backends.quant",
    "QTensor": "backends.quant",
    "QuantSpec": "backends.quant",
    "ScaleMode": "backends.quant",
    "fake_quantize": "backends.quant",
    "fake_quantize_reference": "backends.quant",
    "hadamard_matrix": "backends.quant",
    "hadamard_transform": "backends.quant",
    "pack_fp4": "backends.quant",
    "quantize": "backends.quant",
    "quantize_reference": "backends.quant",
    "sign_vector": "backends.quant",
    "unpack_fp4": "backends.quant",
    "GEMMS": "backends.recipes",
    "NAMED_RECIPES": "backends.recipes",
    "GemmRecipe": "backends.recipes",
    "HadamardSpec": "backends.recipes",
    "Recipe": "backends.recipes",
    "named_recipe": "backends.recipes",
    "Intervention": "backends.recipes",
}

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
    "Intervention",
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
    "quantize",
    "quantize_reference",
    "register_backend",
    "sign_vector",
    "unpack_fp4",
]


ROOMS = ("gemm", "layer", "quant", "recipes")


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
    __getattr__ = lazy_getattr(__name__, _LAZY, ROOMS)
