"""Recipes: which format, rounding, block shape and Hadamard transform each GEMM operand of a
linear layer gets (``recipe``), the published recipes by name (``named``), and the grammar of an
intervention, the study's word and the report's label (``intervention``: ``parse``, ``label``).

    from backends.recipes import Recipe, named_recipe
    Recipe.from_shorthand(["wgrad"], "dht16", base="fp8")  # MXFP4 on wgrad, DHT16, FP8 elsewhere
    named_recipe("nvidia_nvfp4")

This ``__init__`` loads ``recipe`` and ``named`` on first attribute access, so the grammar
(``backends.recipes.intervention``, standard library only) imports without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.lazy import lazy_getattr

if TYPE_CHECKING:
    from backends.recipes.intervention import Intervention
    from backends.recipes.named import NAMED_RECIPES, named_recipe
    from backends.recipes.recipe import (
        BASE_FORMATS,
        GEMMS,
        OPERANDS,
        Gemm,
        GemmRecipe,
        HadamardSpec,
        Recipe,
    )

_LAZY = {
    "Intervention": "backends.recipes.intervention",
    "NAMED_RECIPES": "backends.recipes.named",
    "named_recipe": "backends.recipes.named",
    "BASE_FORMATS": "backends.recipes.recipe",
    "GEMMS": "backends.recipes.recipe",
    "OPERANDS": "backends.recipes.recipe",
    "Gemm": "backends.recipes.recipe",
    "GemmRecipe": "backends.recipes.recipe",
    "HadamardSpec": "backends.recipes.recipe",
    "Recipe": "backends.recipes.recipe",
}

__all__ = [
    "BASE_FORMATS",
    "GEMMS",
    "Gemm",
    "Intervention",
    "NAMED_RECIPES",
    "OPERANDS",
    "GemmRecipe",
    "HadamardSpec",
    "Recipe",
    "named_recipe",
]


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
    __getattr__ = lazy_getattr(__name__, _LAZY)
