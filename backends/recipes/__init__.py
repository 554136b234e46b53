"""Recipes: which format, rounding, block shape and Hadamard transform each GEMM operand of a
linear layer gets (``recipe``), and the published recipes by name (``named``).

    from backends.recipes import Recipe, named_recipe
    Recipe.from_shorthand(["wgrad"], "dht16", base="fp8")  # MXFP4 on wgrad, DHT16, FP8 elsewhere
    named_recipe("nvidia_nvfp4")
"""

from backends.recipes.named import NAMED_RECIPES, named_recipe
from backends.recipes.recipe import (
    BASE_FORMATS,
    GEMMS,
    OPERANDS,
    Gemm,
    GemmRecipe,
    HadamardSpec,
    Recipe,
    parse_intervention,
)

__all__ = [
    "BASE_FORMATS",
    "GEMMS",
    "Gemm",
    "NAMED_RECIPES",
    "OPERANDS",
    "GemmRecipe",
    "HadamardSpec",
    "Recipe",
    "named_recipe",
    "parse_intervention",
]
