"""backends: the numerics of ablate, usable on their own (they import only torch).

Formats and quantizers (``formats``, ``quant``: a C kernel on the CPU, ``fused`` compiled on GPUs),
Hadamard transforms (``hadamard``), per-GEMM recipes (``recipe``) and the published ones by name
(``named``), the quantized linear layer and model conversion (``linear``; ``convert`` for Hugging
Face architectures and any other model), the GEMM backends (their
interface in ``gemm``, named in ``registry``; ``emulated`` on any device, ``native`` on the
hardware's scaled GEMMs) and the benchmark of the quantizers and GEMMs (``bench``). Typical use::

    from backends import Recipe, convert
    convert(model, Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], "dht", base="fp8"))
"""

from .convert import ARCHITECTURES, UnknownArchitectureError, convert
from .formats import E2M1, E4M3, E5M2, ElementFormat, ScaleMode, pack_fp4, unpack_fp4
from .gemm import GemmBackend, UnsupportedFormatError
from .hadamard import hadamard_matrix, hadamard_transform, sign_vector
from .linear import QuantLinear, convert_model
from .named import NAMED_RECIPES, named_recipe
from .quant import FORMATS, QTensor, QuantSpec, fake_quantize, quantize
from .recipe import GEMMS, GemmRecipe, HadamardSpec, Recipe, parse_intervention
from .reference import fake_quantize_reference, quantize_reference
from .registry import available_backends, get_backend, register_backend

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
