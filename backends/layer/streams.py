"""The random streams of a quantized linear layer: which random numbers each call of each GEMM
draws, for stochastic rounding and random Hadamard signs, and how they stay the same when a
forward is recomputed, a run resumes or the batch is split over ranks.

A stream's key is derived from (seed, layer, GEMM, operand or ``signs``, call), where ``call``
counts the layer's training forwards. What a layer keeps (``RandomStreams``, a base class of
``QuantLinear``, so the names below are those of every checkpoint):

    sr_seed         () int64   the seed of the layer's streams (saved)
    calls           () int64   training forwards so far, the "step" of the streams (saved)
    hadamard_signs  (3, 256)   fixed sign vectors of fprop, dgrad, wgrad, drawn once (saved)
    key_prefix      (3, 3)     ``key_prefixes(sr_seed, layer, rank)``: rows fprop, dgrad, wgrad;
                               columns operand a, operand b, signs (derived, not saved)
    recipe_signs    (3, 256)   the recipe's own sign vectors, 0 where none (derived, not saved)

A call's keys extend the prefixes by the call index on the layer's device (``rng.extend_key``), so
the training step never reads a device tensor into Python and a compiled model traces the layer in
one graph.

The call index comes from ``ablate::next_call``, an opaque op that returns the counter and
advances it; a ``CallTape`` records the indices a region's calls drew and hands them out again
when the region's forward is recomputed (activation checkpointing), so the recomputation draws the
original forward's streams and no counter advances twice.

Data parallelism (``set_rank``): every rank quantizes the shared weight identically, so the
weight's streams and the signs of fprop and dgrad carry no rank; the per-rank operands (each
rank's own X and dY) and wgrad's signs (which rotate along the token dimension) add the rank as a
key part (``per_rank``; rank 0 keeps a one-process run's keys).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from backends.gemm import GemmKeys
from backends.quant import DETERMINISTIC, SIZES, sign_vector
from backends.quant.ops import random_signs
from backends.quant.rng import GEMM_IDS, OPERAND_IDS, derive_key, extend_key
from backends.recipes import GEMMS, OPERANDS, GemmRecipe, HadamardSpec, Recipe

_SIGNS_STREAM = 0  # operand id used for Hadamard sign keys
SIGNS_LEN = max(SIZES)


RANK_PART = 1 << 40
"""Rank r > 0 adds the key part ``RANK_PART + r`` (beyond every call index a run reaches, so a
rank's stream is never another call's)."""


def per_rank(gemm: str, stream: str) -> bool:
    """Whether a GEMM's stream (an operand name, or ``signs``) differs between data-parallel ranks:
    the per-rank operands (x, dy: each rank's own tokens), and wgrad's Hadamard signs (wgrad
    rotates along the token dimension, where both operands are per rank). The weight's streams and
    the fprop/dgrad signs (which also rotate W) are shared, so every rank quantizes W alike."""
    if stream == "signs":
        return gemm == "wgrad"
    return stream != "w"


def stream_parts(seed: int, layer_id: int, gemm: str, stream: str, rank: int) -> tuple[int, ...]:
    sid = _SIGNS_STREAM if stream == "signs" else OPERAND_IDS[stream]
    parts = (seed, layer_id, GEMM_IDS[gemm], sid)
    return parts + (RANK_PART + rank,) if rank and per_rank(gemm, stream) else parts


def key_prefixes(seed: int, layer_id: int, rank: int = 0) -> torch.Tensor:
    """(3, 3) int64: ``derive_key(seed, layer, gemm, stream[, RANK_PART + rank])`` per GEMM (fprop,
    dgrad, wgrad) and stream (operand a, operand b, Hadamard signs), the rank part only on rank
    r > 0 and only for ``per_rank`` streams (rank 0 has the keys of a one-process run); a call's
    keys extend these by the call index."""
    rows = []
    for g in GEMMS:
        a_op, b_op = OPERANDS[g]
        rows.append(
            [derive_key(*stream_parts(seed, layer_id, g, s, rank)) for s in (a_op, b_op, "signs")]
        )
    return torch.tensor(rows, dtype=torch.int64)


def set_rank(model: nn.Module, rank: int) -> None:
    """Tell every quantized layer of ``model`` its data-parallel rank (re-deriving its keys)."""
    for m in model.modules():
        if isinstance(m, RandomStreams):
            m.rank = rank


@torch.library.custom_op("ablate::next_call", mutates_args=("calls",))
def _next_call(calls: torch.Tensor) -> torch.Tensor:
    """The counter's value, then the counter advanced by one, on its device.

    An opaque op rather than ``clone`` and ``+=``: under torch.compile, AOTAutograd would recompute
    such a clone in the backward graph from the counter it had already advanced in the forward, so
    dgrad and wgrad would draw the streams of the next call; an opaque op's output is saved."""
    old = calls.clone()
    calls.add_(1)
    return old


@_next_call.register_fake
def _(calls: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(calls)


class CallTape:
    """The call indices that a region's training calls drew, in order: recorded in its forward
    (``recording``) and handed out again, in the same order, to the same calls made once more
    (``replaying``), so a recomputed forward draws the original forward's random streams and no
    counter advances twice. Eager only: under torch.compile a selective checkpoint that saves
    ``ablate::next_call`` does the same (``ablate.model.recompute``)."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []
        self._replayed: int | None = None  # None: recording

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self._replayed = None
        token = _TAPE.set(self)
        try:
            yield
        finally:
            _TAPE.reset(token)

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        self._replayed = 0
        token = _TAPE.set(self)
        try:
            yield
        finally:
            _TAPE.reset(token)

    def draw(self, calls: torch.Tensor) -> torch.Tensor:
        """A training call's index: ``_next_call(calls)`` recorded, or the recorded one replayed."""
        if self._replayed is None:
            self.calls.append(_next_call(calls))
            return self.calls[-1]
        if self._replayed >= len(self.calls):
            raise RuntimeError(
                f"a recomputed forward made more than the {len(self.calls)} quantized training "
                "calls of the forward it repeats: the region is not deterministic"
            )
        self._replayed += 1
        return self.calls[self._replayed - 1]


_TAPE: contextvars.ContextVar[CallTape | None] = contextvars.ContextVar(
    "ablate_call_tape", default=None
)


def training_call(calls: torch.Tensor) -> torch.Tensor:
    """The index of a training call: from the active ``CallTape`` in eager mode, else the
    counter's (``_next_call``)."""
    if not torch.compiler.is_compiling():
        tape = _TAPE.get()
        if tape is not None:
            return tape.draw(calls)
    return _next_call(calls)


def is_random(g: GemmRecipe) -> bool:
    """Whether a GEMM's output depends on its random streams (SR or random Hadamard signs)."""
    sr = any(s is not None and s.is_random for s in (g.a, g.b))  # SR, MS-EDEN's scales
    return sr or (g.hadamard is not None and g.hadamard.signs == "random")


class RandomStreams(nn.Module):
    """The random-stream state and keys of one quantized layer (a base class of ``QuantLinear``;
    see the module docstring). ``init_streams`` registers its buffers."""

    sr_seed: torch.Tensor
    calls: torch.Tensor
    hadamard_signs: torch.Tensor
    key_prefix: torch.Tensor
    recipe_signs: torch.Tensor
    layer_id: int
    _rank: int
    _random: bool

    def init_streams(self, seed: int, layer_id: int, device: torch.device | str | None) -> None:
        self.layer_id = layer_id
        self._rank = 0
        self._random = False
        self.register_buffer("sr_seed", torch.tensor(seed, dtype=torch.int64, device=device))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64, device=device))
        signs = torch.stack(
            [
                sign_vector(SIGNS_LEN, derive_key(seed, layer_id, GEMM_IDS[g], _SIGNS_STREAM))
                for g in GEMMS
            ]
        )
        self.register_buffer("hadamard_signs", signs.to(device))  # (3, 256) +-1
        self.register_buffer(
            "key_prefix", key_prefixes(seed, layer_id).to(device), persistent=False
        )
        self.register_buffer(
            "recipe_signs", torch.zeros(3, SIGNS_LEN, device=device), persistent=False
        )

    def streams_for(self, recipe: Recipe) -> None:
        """Follow ``recipe``: whether any GEMM draws random numbers, and its own sign vectors."""
        self._random = any(is_random(recipe.gemm(g)) for g in GEMMS)
        with torch.no_grad():
            self.recipe_signs.zero_()
            for i, g in enumerate(GEMMS):
                h = recipe.gemm(g).hadamard
                if h is not None and h.vector is not None:
                    self.recipe_signs[i, : h.size] = torch.tensor(h.vector, dtype=torch.float32)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any, **kw: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kw)
        if prefix + "sr_seed" in state_dict:  # the key prefixes follow the loaded seed
            self._derive_prefixes()  # once per load

    @property
    def rank(self) -> int:
        """The data-parallel rank whose streams this layer draws (0: one process); setting it
        re-derives the keys (``per_rank``)."""
        return self._rank

    @rank.setter
    def rank(self, rank: int) -> None:
        if rank < 0:
            raise ValueError(f"rank: must be >= 0, got {rank}")
        self._rank = rank
        self._derive_prefixes()

    def _derive_prefixes(self) -> None:
        prefixes = key_prefixes(int(self.sr_seed), self.layer_id, self._rank)
        with torch.no_grad():
            self.key_prefix.copy_(prefixes.to(self.key_prefix.device))

    def next_call(self, training: bool) -> torch.Tensor:
        """This call's index on the device (no host sync): a training call draws the next one
        (from the active ``CallTape`` when a region is recorded or replayed); any other call reads
        the counter without advancing it."""
        return training_call(self.calls) if training else self.calls.clone()

    def key_table(self, call: torch.Tensor) -> torch.Tensor:
        """(3, 3) int64 keys of ``call`` (rows: fprop, dgrad, wgrad; columns: a, b, signs), derived
        on the device; an empty tensor when no GEMM of the recipe draws random numbers."""
        if not self._random:
            return call.new_empty(0)
        return extend_key(self.key_prefix, call)

    def keys(
        self, gemm: str, call: int | torch.Tensor, table: torch.Tensor | None = None
    ) -> GemmKeys:
        """The keys of ``gemm`` at ``call``: from ``table`` (``key_table(call)``, the training
        step: int64 tensors on the layer's device, no host synchronisation), else Python ints
        (probes). A recipe without SR or random signs uses no key: zeros."""
        if table is not None:
            if table.numel() == 0:
                return GemmKeys(a=0, b=0, signs=0)
            k = table[GEMMS.index(gemm)]
            return GemmKeys(a=k[0], b=k[1], signs=k[2])
        if isinstance(call, torch.Tensor):
            return self.keys(gemm, call, self.key_table(call))
        seed, a_op, b_op = int(self.sr_seed), *OPERANDS[gemm]

        def key(stream: str) -> int:
            return derive_key(*stream_parts(seed, self.layer_id, gemm, stream, self.rank), call)

        return GemmKeys(a=key(a_op), b=key(b_op), signs=key("signs"))

    def hadamard_signs_of(
        self, gemm: str, h: HadamardSpec | None, keys: GemmKeys
    ) -> torch.Tensor | None:
        """The sign vector of ``gemm``'s Hadamard transform ``h`` for a call with ``keys`` (None:
        no transform, or dht's none): the recipe's own vector, the layer's fixed one (fht), or one
        drawn from the call's ``signs`` key (rht)."""
        if h is None or h.signs == DETERMINISTIC:  # dht: H itself, no signs
            return None
        if h.vector is not None:  # the recipe's one vector, for every layer
            return self.recipe_signs[GEMMS.index(gemm), : h.size]
        if h.signs == "fixed":
            return self.hadamard_signs[GEMMS.index(gemm), : h.size]
        return random_signs(h.size, keys.signs, device=self.hadamard_signs.device)


__all__ = [
    "RANK_PART",
    "CallTape",
    "RandomStreams",
    "is_random",
    "key_prefixes",
    "per_rank",
    "set_rank",
    "stream_parts",
    "training_call",
]
