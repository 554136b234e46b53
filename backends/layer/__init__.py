"""The quantized linear layer and what puts it into a model.

- ``linear``: ``QuantLinear``, a drop-in ``nn.Linear`` that routes its three GEMMs by the recipe;
- ``streams``: the random streams of a layer (seed, layer, rank, call counter, the tape that
  replays a recomputed forward's calls, the keys of each GEMM);
- ``convert``: ``convert_model``, which replaces a model's linears by path, and ``convert(model,
  recipe, select=...)``, the decoder linears of a Hugging Face architecture by its family's table;
  ``set_recipe``, a converted model under another recipe (a precision schedule's switch);
- ``probe``: how far each quantized GEMM is from the exact one, during training.
"""

from backends.layer.convert import (
    ARCHITECTURES,
    UnknownArchitectureError,
    check_recipe,
    convert,
    convert_model,
    set_recipe,
)
from backends.layer.linear import QuantLinear

__all__ = [
    "ARCHITECTURES",
    "QuantLinear",
    "UnknownArchitectureError",
    "check_recipe",
    "convert",
    "convert_model",
    "set_recipe",
]
