"""An intervention's grammar: the word a study writes for what is done to its FP4 GEMMs beyond
quantizing them, and the label a resolved recipe is reported under. One parser (``parse``), one
writer (``label``), one default Hadamard size (``DEFAULT_SIZE``)::

    intervention  none | PART[+PART...]     each part at most once, at most one Hadamard transform
    PART          sr       stochastic rounding (a shorthand adds the 3/4 clip-free prescale)
                  rht[N]   Hadamard transform with random signs, redrawn at every call (Tseng et al.)
                  dht[N]   deterministic Hadamard transform, no signs (the H16 of the MXFP4 paper)
                  fht[N]   Hadamard transform with one fixed sign vector per layer and GEMM
                  eden     MS-EDEN rounding (Quartet II)       labels only: quantizers a named or
                  4over6   Four Over Six block scales          explicit recipe sets, no shorthand
    N             the Hadamard size: 16, 32, 64, 128 or 256 (``backends.quant.hadamard``), 16 when
                  left out

A label writes the parts in the order sr, eden, 4over6, Hadamard, the size always (``dht`` is
labelled ``dht16``). A recipe whose FP4 GEMMs differ is labelled GEMM by GEMM,
``fprop:none,dgrad:sr,wgrad:sr+fht16`` (``label`` of a mapping; ``parse_label`` reads either form).

The study's schema parses a cell's ``intervention`` once (``ablate.study.schema.CellConfig``);
``Recipe.from_shorthand`` builds the GEMMs from the parsed value; ``GemmRecipe.intervention`` reads it
back from resolved GEMMs, which labels the cell; the report parses the labels MLflow recorded
(``ablate.report.speedup`` charges their costs, ``plots`` and ``metrics`` style and sort by them).

Standard library only: importing it imports no torch (the report reads labels without it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast, get_args

Gemm = Literal["fprop", "dgrad", "wgrad"]
"""A linear layer's three GEMMs (the table of ``backends.recipes.recipe``)."""
GEMMS: tuple[Gemm, ...] = get_args(Gemm)

HadamardKind = Literal["rht", "dht", "fht"]
HADAMARD_KINDS: tuple[HadamardKind, ...] = get_args(HadamardKind)
SIGNS: dict[HadamardKind, str] = {"rht": "random", "dht": "none", "fht": "fixed"}
"""Each Hadamard kind's sign policy (``backends.quant.hadamard.SignPolicy``; dht's ``none`` is its
``DETERMINISTIC``)."""
DEFAULT_SIZE = 16
"""The Hadamard size of a part written without one (``dht`` is ``dht16``)."""
QUANTIZER_PARTS = ("eden", "4over6")
"""Parts of a label that no shorthand writes: quantizers of a named or explicit recipe."""

_HADAMARD = re.compile(r"(rht|dht|fht)(\d+)?")
_SHORTHAND_HELP = (
    "none, sr, rht, dht, fht and their combinations with '+' (e.g. sr+rht), Hadamard size as a "
    "suffix (rht64, dht16)"
)
_LABEL_HELP = "none, sr, eden, 4over6, rht[N], dht[N], fht[N] and their combinations with '+'"


@dataclass(frozen=True, slots=True)
class Hadamard:
    """A Hadamard transform as an intervention names it: its kind (which signs) and size."""

    kind: HadamardKind
    size: int = DEFAULT_SIZE

    @property
    def signs(self) -> str:
        """The sign policy of ``backends.quant.hadamard`` (``SIGNS``)."""
        return SIGNS[self.kind]

    @classmethod
    def with_signs(cls, signs: str, size: int) -> Hadamard:
        """The kind of a transform with sign policy ``signs``: none -> dht, fixed -> fht,
        random -> rht."""
        for kind, policy in SIGNS.items():
            if policy == signs:
                return cls(kind, size)
        raise ValueError(f"signs: unknown policy {signs!r}; allowed: {', '.join(SIGNS.values())}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Intervention:
    """What one GEMM (or every FP4 GEMM of a shorthand) does beyond quantizing its operands."""

    sr: bool = False
    """Stochastic rounding."""
    eden: bool = False
    """MS-EDEN rounding."""
    four_over_six: bool = False
    """Four Over Six block scales."""
    hadamard: Hadamard | None = None
    """The Hadamard transform of both operands along the reduction dimension."""

    @property
    def shorthand(self) -> bool:
        """Whether a study's shorthand can say it (no quantizer of a named recipe)."""
        return not (self.eden or self.four_over_six)

    def parts(self, *, sizes: bool = True) -> list[str]:
        """The label's parts in order (``["sr", "rht64"]``; ``sizes=False``: ``["sr", "rht"]``)."""
        flags = (("sr", self.sr), ("eden", self.eden), ("4over6", self.four_over_six))
        out = [name for name, on in flags if on]
        if self.hadamard is not None:
            out.append(self.hadamard.kind + (str(self.hadamard.size) if sizes else ""))
        return out


NONE = Intervention()
"""No intervention: the GEMM quantizes its operands, nothing else."""


class UnknownPart(ValueError):
    """A part of ``text`` that the grammar does not know (``part``), with what it allows."""

    def __init__(self, text: str, part: str, allowed: str) -> None:
        super().__init__(f"intervention: unknown {text!r}; allowed: {allowed}")
        self.text, self.part, self.allowed = text, part, allowed


def parse(text: str, *, shorthand: bool = False) -> Intervention:
    """``"sr+rht64"`` -> ``Intervention(sr=True, hadamard=Hadamard("rht", 64))``; ``"none"`` and
    ``""`` -> ``NONE``. ``shorthand``: only what a study's ``intervention`` may say (no ``eden``,
    ``4over6``). ValueError (``UnknownPart`` for an unknown part) naming what is allowed."""
    if text.strip() in ("none", ""):
        return NONE
    found: dict[str, bool] = {}
    hadamard: Hadamard | None = None
    for part in (p.strip() for p in text.split("+")):
        m = _HADAMARD.fullmatch(part)
        if m is not None:
            if hadamard is not None:
                raise ValueError(f"intervention: only one Hadamard transform allowed in {text!r}")
            size = int(m.group(2)) if m.group(2) else DEFAULT_SIZE
            hadamard = Hadamard(cast(HadamardKind, m.group(1)), size)
        elif part == "sr" or (part in QUANTIZER_PARTS and not shorthand):
            if part in found:
                raise ValueError(f"intervention: {part!r} given twice in {text!r}")
            found[part] = True
        else:
            raise UnknownPart(text, part, _SHORTHAND_HELP if shorthand else _LABEL_HELP)
    return Intervention(
        sr="sr" in found, eden="eden" in found, four_over_six="4over6" in found, hadamard=hadamard
    )


def label(what: Intervention | Mapping[str, Intervention], *, sizes: bool = True) -> str:
    """The label of an intervention (``sr+rht64``, ``none``), or of each FP4 GEMM's (a mapping
    from GEMM, in GEMM order): one label when they are all the same, else one per GEMM
    (``fprop:none,dgrad:sr,wgrad:sr+fht16``). ``sizes=False`` leaves the Hadamard sizes out
    (``sr+rht``: the report's line style)."""
    if isinstance(what, Intervention):
        return "+".join(what.parts(sizes=sizes)) or "none"
    distinct = set(what.values())
    if len(distinct) <= 1:
        return label(next(iter(distinct), NONE), sizes=sizes)
    return ",".join(f"{g}:{label(v, sizes=sizes)}" for g, v in what.items())


def parse_label(text: str) -> Intervention | dict[str, Intervention]:
    """A label as ``label`` writes it: one intervention, or one per GEMM it lists."""
    if ":" not in text:
        return parse(text)
    out: dict[str, Intervention] = {}
    for item in text.split(","):
        gemm, sep, word = item.partition(":")
        if not sep or gemm.strip() not in GEMMS:
            raise ValueError(
                f"intervention {text!r}: {item!r} is not ROLE:INTERVENTION with ROLE one of "
                f"{', '.join(GEMMS)}"
            )
        out[gemm.strip()] = parse(word)
    return out


__all__ = [
    "DEFAULT_SIZE",
    "GEMMS",
    "HADAMARD_KINDS",
    "NONE",
    "QUANTIZER_PARTS",
    "SIGNS",
    "Gemm",
    "Hadamard",
    "HadamardKind",
    "Intervention",
    "UnknownPart",
    "label",
    "parse",
    "parse_label",
]
