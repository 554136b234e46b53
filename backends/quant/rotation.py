"""What a Hadamard transform before quantization is, in plain Python (a study names and checks its
rotations without torch): the block sizes (``SIZES``, ``check_size``), the sign policies
(``SignPolicy``: ``none`` is dht's ``DETERMINISTIC`` transform, ``fixed`` fht's, ``random``
rht's) and ``Rotation(size, signs)``, the transform a quantizer applies. The transforms themselves
are ``hadamard.py``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    import torch

SIZES = (16, 32, 64, 128, 256)
SIGN_POLICIES = ("none", "fixed", "random")
SignPolicy = Literal["none", "fixed", "random"]
DETERMINISTIC: SignPolicy = "none"
"""The intervention dht's sign policy: the deterministic H, no signs (``signs=None`` in
``hadamard.py``'s transforms). Spelled ``none`` in every stored recipe and so in every cell's
key."""


class Rotation(NamedTuple):
    """The Hadamard transform a quantizer applies before it quantizes: ``hadamard_transform(x,
    axis, size, signs)``; ``signs`` None for dht (``DETERMINISTIC``), else the +-1 vector of
    ``size`` entries (fht's fixed one, or rht's drawn for this call)."""

    size: int
    signs: torch.Tensor | None


def rotation(h: tuple[int, torch.Tensor | None] | None) -> Rotation | None:
    """``h`` as a ``Rotation``: the quantizer's entry points also take a plain ``(size, signs)``."""
    return None if h is None else Rotation(*h)


def check_size(size: int) -> None:
    if size not in SIZES:
        raise ValueError(
            f"hadamard size {size!r} is not supported; allowed: {', '.join(map(str, SIZES))} "
            "(powers of two from 16 to 256)"
        )
