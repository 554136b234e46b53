"""The quantized linear layer and what puts it into a model.

- ``linear``: ``QuantLinear``, a drop-in ``nn.Linear`` whose three GEMMs follow a recipe, and
  ``convert_model``, which replaces a model's linears by path;
- ``streams``: the random streams of a layer (seed, layer, rank, call counter, the tape that
  replays a recomputed forward's calls, the keys of each GEMM);
- ``convert``: ``convert(model, recipe, select=...)``, the decoder linears of a Hugging Face
  architecture placed by its family's table;
- ``probe``: how far each quantized GEMM is from the exact one, during training.
"""

from backends.layer.convert import ARCHITECTURES, UnknownArchitectureError, convert
from backends.layer.linear import QuantLinear, convert_model

__all__ = [
    "ARCHITECTURES",
    "QuantLinear",
    "UnknownArchitectureError",
    "convert",
    "convert_model",
]
