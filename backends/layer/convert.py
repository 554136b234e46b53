"""Quantized numerics in any PyTorch model: ``convert_model`` by module path, and ``convert(model,
recipe, select=...)`` by a Hugging Face architecture's table.

``convert_model`` swaps a model's ``nn.Linear`` modules for ``QuantLinear`` by name; embeddings are
not linears, and the LM head (``lm_head``/``output``/``head``) stays in high precision because its
logits feed the softmax directly and every published FP4 recipe keeps it there. A recipe's layer
selection (``Recipe.layer_types``, ``blocks``, ``keep_first``/``keep_last``) reads a linear's type and
block from its path (``layer_type``; ``layers.3.attention.wq`` is an attention linear of block 3).
Before any linear is swapped the backend checks the recipe against the device, and the native
backend's GEMMs are held to the emulation (``backends.gemm.selfcheck``): a refusal leaves the model
as it was.

``convert`` replaces the linears of a model's decoder layers by ``QuantLinear`` under ``recipe``, the
same three GEMMs and random-stream keys per layer as ``ablate``'s own trainer uses. What a linear is
(attention or MLP, which block) comes from a small table per architecture family (``ARCHITECTURES``,
Hugging Face ``transformers`` naming), so a family's layer selection means the same on every model
of it: ``select={"layers": ["mlp"], "keep_first": 1}`` quantizes the MLP linears of every block but
the first. Embeddings, norms and the LM head stay in high precision, as every published FP4 recipe
keeps them.

A model with a Hugging Face config (``model.config.model_type``) must be of a known family, and every
linear of its decoder layers must be one the table names: an unknown architecture, or a linear the
table does not know (a new projection that would silently stay in high precision), is refused with
its name and the names that are known. A model without such a config (a plain ``nn.Module``) is
converted by its module paths (``convert_model``: the first integer in a path is the block,
``attention``/``attn``/``self_attn`` and ``mlp``/``feed_forward`` mark the type).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from backends.gemm import get_backend
from backends.gemm.native import NativeBackend
from backends.gemm.selfcheck import self_check
from backends.layer.linear import QuantLinear
from backends.recipes import Recipe

DEFAULT_EXCLUDE = ("lm_head", "output", "head")
_BLOCK_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
LAYER_TYPE_NAMES = {
    "attention": ("attention", "attn", "self_attn", "self_attention", "cross_attn"),
    "mlp": ("feed_forward", "mlp", "ffn", "ff"),
}
"""Path components that mark a linear's type (this project's model: ``attention``, ``feed_forward``;
Hugging Face Llama: ``self_attn``, ``mlp``)."""


def layer_type(name: str) -> str | None:
    """``attention``, ``mlp`` or None for a linear's dotted path: the type of its closest
    enclosing module whose name marks one."""
    for part in reversed(name.split(".")[:-1]):
        for t, marks in LAYER_TYPE_NAMES.items():
            if part in marks:
                return t
    return None


def convert_model(
    model: nn.Module,
    recipe: Recipe,
    *,
    backend: str = "emulated",
    seed: int = 0,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    include: Callable[[str, nn.Linear], bool] | None = None,
) -> list[str]:
    """Replace ``model``'s ``nn.Linear`` modules in place by ``QuantLinear``; returns their names.

    Modules whose last name component is in ``exclude`` (the LM head) stay as they are, as do those
    ``include(name, module)`` rejects. The transformer block of a linear is the first integer in its
    path (``layers.3.attn.wq`` is block 3), its type what ``layer_type`` reads from the path; the
    linears the recipe's layer selection leaves out (``keep_first``/``keep_last`` blocks, blocks not
    in ``blocks``, types not in ``layer_types``) get the all-high-precision recipe. Layer ids (for
    random streams) number the converted layers in order.
    """
    excluded = set(exclude)
    targets: list[tuple[str, nn.Linear, int | None]] = []
    for name, mod in model.named_modules():
        if type(mod) is not nn.Linear:
            continue
        if name.rsplit(".", 1)[-1] in excluded or (include is not None and not include(name, mod)):
            continue
        targets.append((name, mod, _block_of(name)))
    blocks = [b for _, _, b in targets if b is not None]
    n_blocks = max(blocks) + 1 if blocks else None
    check_recipe(model, recipe, backend, n_blocks=n_blocks)
    for layer_id, (name, mod, block) in enumerate(targets):
        q = QuantLinear.from_linear(
            mod,
            recipe=recipe.for_layer(layer_type(name), block, n_blocks),
            backend=backend,
            layer_id=layer_id,
            seed=seed,
        )
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, q)
    return [n for n, _, _ in targets]


def check_recipe(
    model: nn.Module, recipe: Recipe, backend: str = "emulated", *, n_blocks: int | None = None
) -> None:
    """Refuse ``recipe`` where it cannot run on ``model``: its layer selection against the model's
    ``n_blocks`` blocks (None: counted from its converted linears, else its linears), the backend
    against the device, the native backend's GEMMs against the emulation."""
    blocks = n_blocks or _block_count(model, QuantLinear) or _block_count(model, nn.Linear)
    if blocks is not None:
        recipe.check_blocks(blocks)
    device = next(model.parameters()).device
    gemms = get_backend(backend)
    gemms.check(recipe, device)
    if isinstance(gemms, NativeBackend):  # the device's GEMMs held to the emulation, once
        self_check(recipe, device, gemms)


def set_recipe(model: nn.Module, recipe: Recipe) -> None:
    """Put a converted model's ``QuantLinear`` layers under ``recipe`` in place (a precision
    schedule's switch), each layer as ``convert_model`` would have selected it; their weights and
    random streams stay as they are. Check the recipe first (``check_recipe``)."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    n_blocks = _block_count(model, QuantLinear)
    for name, q in layers:
        q.recipe = recipe.for_layer(layer_type(name), _block_of(name), n_blocks)


def _block_of(name: str) -> int | None:
    m = _BLOCK_INDEX.search(name)
    return int(m.group(1)) if m else None


def _block_count(model: nn.Module, kind: type[nn.Module]) -> int | None:
    found = [_block_of(n) for n, m in model.named_modules() if type(m) is kind]
    blocks = [b for b in found if b is not None]
    return max(blocks) + 1 if blocks else None


@dataclass(frozen=True, slots=True)
class Architecture:
    """Where a family keeps its decoder layers and what each layer's linears are."""

    layers: str
    """Dotted path of the decoder layers' ``nn.ModuleList`` (``model.layers``)."""
    attention: tuple[str, ...]
    """Module paths, inside a decoder layer, of the attention linears."""
    mlp: tuple[str, ...]
    """Module paths, inside a decoder layer, of the MLP linears."""

    def linears(self) -> dict[str, str]:
        """{path inside a layer: "attention" or "mlp"}."""
        return {p: "attention" for p in self.attention} | {p: "mlp" for p in self.mlp}


_LLAMA_LIKE = Architecture(
    layers="model.layers",
    attention=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    mlp=("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
)

# fmt: off
ARCHITECTURES: dict[str, Architecture] = {
    # every family here names its decoder's linears as Llama does (transformers 4.5x and 5.x)
    "llama": _LLAMA_LIKE, "mistral": _LLAMA_LIKE, "qwen2": _LLAMA_LIKE, "qwen3": _LLAMA_LIKE,
    "olmo2": _LLAMA_LIKE, "gemma": _LLAMA_LIKE, "gemma2": _LLAMA_LIKE,
    # fused projections: one GEMM for Q, K and V, one for gate and up
    "phi3": Architecture(
        layers="model.layers",
        attention=("self_attn.qkv_proj", "self_attn.o_proj"),
        mlp=("mlp.gate_up_proj", "mlp.down_proj"),
    ),
}
# fmt: on
"""Architecture families by Hugging Face ``model_type``."""

SELECT_KEYS = ("layers", "blocks", "keep_first", "keep_last")


class UnknownArchitectureError(ValueError):
    """A model whose decoder linears ``convert`` cannot place (unknown family or linear)."""


def architecture_of(model: nn.Module) -> tuple[str, Architecture] | None:
    """``(model_type, its Architecture)`` for a model with a Hugging Face config; None for a model
    without one. Raises ``UnknownArchitectureError`` for a family the table does not know."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str):
        return None
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        raise UnknownArchitectureError(
            f"architecture {model_type!r} ({type(model).__name__}) is not one whose linears ablate "
            f"knows; known: {', '.join(sorted(ARCHITECTURES))}"
        )
    return model_type, arch


def decoder_linears(model: nn.Module) -> dict[str, tuple[int, str]]:
    """{module path: (block index, "attention" or "mlp")} of every linear in the decoder layers of a
    model of a known family; refuses a linear there that the family's table does not name."""
    found = architecture_of(model)
    if found is None:
        raise UnknownArchitectureError(
            f"{type(model).__name__} has no Hugging Face config (model.config.model_type); "
            "backends.convert_model converts a plain model by its module paths"
        )
    model_type, arch = found
    try:
        layers = model.get_submodule(arch.layers)
    except AttributeError as e:
        raise UnknownArchitectureError(
            f"architecture {model_type!r}: no decoder layers at {arch.layers!r} in "
            f"{type(model).__name__}"
        ) from e
    known = arch.linears()
    out: dict[str, tuple[int, str]] = {}
    for i, layer in enumerate(layers.children()):
        for path, mod in layer.named_modules():
            if not isinstance(mod, nn.Linear):
                continue
            if path not in known:
                raise UnknownArchitectureError(
                    f"architecture {model_type!r}: decoder layer {i} has a linear {path!r} that "
                    f"ablate's table does not know; known: {', '.join(known)}"
                )
            out[f"{arch.layers}.{i}.{path}"] = (i, known[path])
    return out


def select_recipe(recipe: Recipe, select: Mapping[str, Any] | None) -> Recipe:
    """``recipe`` on the layers ``select`` names: ``layers`` (a list of ``attention``, ``mlp``),
    ``blocks`` (block indices, negative from the end), ``keep_first``/``keep_last`` (blocks left in
    high precision)."""
    if not select:
        return recipe
    unknown = sorted(set(select) - set(SELECT_KEYS))
    if unknown:
        raise ValueError(f"select: unknown key(s) {unknown}; allowed: {', '.join(SELECT_KEYS)}")
    types = select.get("layers")
    if isinstance(types, str):
        types = [types]
    blocks: Iterable[int] | None = select.get("blocks")
    return recipe.select(
        keep_first=int(select.get("keep_first", 0)),
        keep_last=int(select.get("keep_last", 0)),
        layer_types=types,
        blocks=blocks,
    )


def convert(
    model: nn.Module,
    recipe: Recipe,
    *,
    select: Mapping[str, Any] | None = None,
    backend: str = "emulated",
    seed: int = 0,
) -> list[str]:
    """Replace ``model``'s decoder linears in place by ``QuantLinear`` under ``recipe`` (restricted
    to ``select``); returns the converted paths, in the order their layer ids (random-stream keys)
    number them. ``backend``: ``emulated`` (any device) or ``native``; ``seed``: the random streams'
    seed (stochastic rounding, random Hadamard signs)."""
    recipe = select_recipe(recipe, select)
    if architecture_of(model) is None:
        return convert_model(model, recipe, backend=backend, seed=seed)
    paths = decoder_linears(model)
    return convert_model(
        model, recipe, backend=backend, seed=seed, exclude=(), include=lambda n, _: n in paths
    )


__all__ = [
    "ARCHITECTURES",
    "check_recipe",
    "set_recipe",
    "SELECT_KEYS",
    "Architecture",
    "UnknownArchitectureError",
    "architecture_of",
    "convert",
    "decoder_linears",
    "select_recipe",
]
