"""What a quantized operand is: its format (``BlockFormat``, ``FORMATS``) and how it is quantized
(``QuantSpec``, checked when made), in plain Python: a study names and checks its operands without
torch. The result of quantizing one (``QTensor``) is ``qtensor.py``'s; the rules of quantization
itself and its entry points are ``quantizer.py``'s."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from backends.quant import variants
from backends.quant.formats import E2M1, E4M3, E5M2, ElementFormat, ScaleMode

Rounding = Literal["rne", "sr", "eden"]
ScaleKind = Literal["e8m0", "nv", "tensor"]

PRESCALE = 0.75  # Tseng et al.'s clip-free prescale for stochastic rounding


@dataclass(frozen=True, slots=True)
class BlockFormat:
    """A quantized format: element type, how it is scaled, default block size."""

    name: str
    elem: ElementFormat
    scale: ScaleKind
    block: int | None  # None: one scale per tensor

    @property
    def is_fp4(self) -> bool:
        return self.elem is E2M1


FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        BlockFormat("mxfp4", E2M1, "e8m0", 32),
        BlockFormat("mxfp8_e4m3", E4M3, "e8m0", 32),
        BlockFormat("mxfp8_e5m2", E5M2, "e8m0", 32),
        BlockFormat("nvfp4", E2M1, "nv", 16),
        BlockFormat("fp8_e4m3", E4M3, "tensor", None),
        BlockFormat("fp8_e5m2", E5M2, "tensor", None),
    )
}
BLOCK_SIZES = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def option(
    *, key: str = "unless_default", choices: tuple[str, ...] | None = None, of_format: bool = False
) -> dict[str, Any]:
    """The metadata of an operand option (a ``QuantSpec`` field), from which the recipe's forms
    derive: ``key`` how it enters the stored form and a cell's key (``always``, or
    ``unless_default``: left out at its default, so a new option changes no recorded key),
    ``choices`` its allowed values (the study schema's), ``of_format`` whether it belongs to the
    format (dropped when an override changes the format)."""
    return {"key": key, "choices": choices, "of_format": of_format}


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantSpec:
    """How one GEMM operand is quantized.

    Its fields are the operand options of every form of a recipe: the explicit form a study
    writes (``options``/``from_options``: ``block: [rows, cols]`` stands for ``block_rows`` and
    ``block_size``), the stored form (``to_dict``), ``ablate recipe``'s table and the study schema
    all read them from here; a new option is a field with its ``option`` metadata, its check
    (``variants.check``) and its quantizer."""

    format: str = field(metadata={"key": "always"})
    """One of ``FORMATS``: mxfp4, mxfp8_e4m3, mxfp8_e5m2, nvfp4, fp8_e4m3, fp8_e5m2."""
    rounding: Rounding = field(
        default="rne", metadata=option(key="always", choices=variants.ROUNDINGS)
    )
    """Element rounding: round-to-nearest-even, stochastic, or eden (MS-EDEN, nvfp4 after a
    Hadamard transform: ``ms_eden.py``)."""
    prescale: bool | float = field(default=False, metadata=option(key="always"))
    """Scale by 3/4 (True) or by this factor in (0, 1) before rounding so nothing saturates
    (compensated on the GEMM output); 16/17 is fouroversix's unbiased stochastic rounding."""
    scale_mode: ScaleMode = field(
        default=ScaleMode.FLOOR,
        metadata=option(key="always", choices=tuple(m.value for m in ScaleMode), of_format=True),
    )
    """E8M0 shared-exponent rule (MX formats only); see ``ScaleMode``."""
    block_size: int | None = field(default=None, metadata=option(key="always", of_format=True))
    """Override of the format's block size (MX: 32, NVFP4: 16); a power of two up to 1024."""
    block_rows: int = field(default=1, metadata=option(of_format=True))
    """Rows per scale: 1 (one scale per ``block`` elements of a row) or ``block`` (2-D square
    tiles of a 2-D operand, e.g. NVIDIA's 16x16 NVFP4 weight blocks)."""
    scale_rule: str | None = field(
        default=None, metadata=option(choices=variants.SCALE_RULES, of_format=True)
    )
    """Four Over Six (nvfp4): mse, mae or abs_max: per block, the scale mapping its maximum to 6
    or to 4, whichever errs less by that measure (``four_over_six.py``); None: the one NVFP4
    scale."""
    scale_pick: str = field(
        default="rounded", metadata=option(choices=variants.SCALE_PICKS, of_format=True)
    )
    """Four Over Six under stochastic rounding: compare the two candidate scales as they round,
    with the same draws (``rounded``: the published recipes; biased, ``docs/recipes.md`` gives
    the measured bias), or as they round to nearest, the chosen scale then rounding
    stochastically (``nearest``: unbiased). The same under round to nearest."""
    outer_block: int | None = field(default=None, metadata=option(of_format=True))
    """Double-block nvfp4: an FP32 scale per this many elements (TetraJet-v2: 128) instead of one
    per tensor (``double_block.py``)."""
    fmt: BlockFormat = field(init=False, repr=False, compare=False)
    wire: str = field(init=False, repr=False, compare=False)
    """The spec as a JSON string of its fields (declaration order, enums by value), its quotes
    written ``'``: what the quantizer's custom ops take (``ops.py``), stable across processes.
    Nothing in it needs escaping in a C++ string literal: Inductor's C++ wrapper (``cpp_wrapper``)
    writes an op's string argument into its source as it is, and a ``"`` there failed the
    compile. An attribute, not a function of the spec, so that a traced model reads it as a
    constant (torch 2.11's Dynamo cannot pass a frozen dataclass to a function it runs at trace
    time)."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(
                f"format: unknown format {self.format!r}; allowed: {', '.join(FORMATS)}"
            )
        object.__setattr__(self, "fmt", FORMATS[self.format])
        try:
            object.__setattr__(self, "scale_mode", ScaleMode(self.scale_mode))
        except ValueError:
            allowed = ", ".join(m.value for m in ScaleMode)
            raise ValueError(
                f"scale_mode: unknown mode {self.scale_mode!r}; allowed: {allowed}"
            ) from None
        if self.rounding not in variants.ROUNDINGS:
            raise ValueError(
                f"rounding: unknown {self.rounding!r}; allowed: {', '.join(variants.ROUNDINGS)}"
            )
        object.__setattr__(self, "prescale", variants.check_prescale(self.prescale))
        if self.block_size is not None:
            if self.fmt.block is None:
                raise ValueError(
                    f"block_size: {self.format} is scaled per tensor and takes no block size"
                )
            if self.block_size not in BLOCK_SIZES:
                raise ValueError(
                    f"block_size: {self.block_size} is not allowed; allowed: "
                    f"{', '.join(map(str, BLOCK_SIZES))}"
                )
        if self.block_rows != 1:
            if self.fmt.block is None:
                raise ValueError(
                    f"block_rows: {self.format} is scaled per tensor and takes no 2-D blocks"
                )
            if self.block_rows != self.block:
                raise ValueError(
                    f"block_rows: {self.block_rows} is not allowed for blocks of {self.block}; "
                    f"allowed: 1 (1x{self.block} blocks) or {self.block} "
                    f"({self.block}x{self.block} tiles)"
                )
        variants.check(self)
        object.__setattr__(self, "wire", _wire(self))

    @property
    def block(self) -> int:
        """Elements per scale along the quantized axis (0 for per-tensor formats)."""
        return self.block_size or self.fmt.block or 0

    @property
    def prescale_factor(self) -> float:
        return variants.prescale_factor(self.prescale)

    @property
    def variant(self) -> bool:
        """Whether a ``variants`` option is set: only the torch path of ``torch_path.py`` runs it."""
        return self.scale_rule is not None or self.rounding == "eden" or bool(self.outer_block)

    @property
    def is_random(self) -> bool:
        """Whether quantizing draws random numbers (stochastic rounding, MS-EDEN's scales)."""
        return self.rounding != "rne"

    @property
    def nv_top(self) -> float | None:
        """NVFP4: what the tensor amax maps to, 6 * 448 (6 * 256 with Four Over Six); values
        decode as ``q * ((s * amax) * fp32(1/top))``. None for MS-EDEN (decoded with its tensor
        decode scale) and double-block NVFP4 (its outer scales), and for other formats."""
        if self.fmt.scale != "nv" or self.rounding == "eden" or self.outer_block:
            return None
        return (
            variants.FOUR_OVER_SIX_TOP if self.scale_rule else float(self.fmt.elem.max * E4M3.max)
        )

    def short(self) -> str:
        """Compact label, e.g. ``mxfp4``, ``mxfp4/sr``, ``mxfp4/ceil/sr*0.75``."""
        s = self.format
        if self.fmt.scale == "e8m0" and self.scale_mode != ScaleMode.FLOOR:
            s += f"/{self.scale_mode.value}"
        if self.block_size is not None:
            s += f"/b{self.block_size}"
        if self.block_rows != 1:
            s += f"/{self.block_rows}x{self.block}"
        if self.scale_rule is not None:
            s += f"/4o6{self.scale_rule.replace('_', '')}"
            s += "-nearest" if self.scale_pick == "nearest" else ""
        if self.outer_block:
            s += f"/o{self.outer_block}"
        if self.rounding != "rne":
            s += f"/{self.rounding}"
        if self.prescale:
            s += f"*{self.prescale_factor:.4g}"
        return s

    # ------------------------------------------------------------------------------------------
    # the forms of a recipe, derived from the fields and their ``option`` metadata

    def options(self) -> dict[str, Any]:
        """The operand in the explicit form of a recipe (a study's ``gemms:``): ``format`` and
        every option that differs from its default, by the form's names; ``block: [rows, cols]``
        where ``block_size`` or ``block_rows`` is set. ``from_options`` inverts it."""
        out: dict[str, Any] = {"format": self.format}
        for f in _OPTION_FIELDS:
            v = getattr(self, f.name)
            if v == f.default:
                continue
            if f.name in _BLOCK_FIELDS:
                out["block"] = [self.block_rows, self.block]
            else:
                out[f.name] = getattr(v, "value", v)
        return {k: out[k] for k in ("format", *OPTION_NAMES) if k in out}

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> QuantSpec:
        """The spec of an operand in the explicit form (``options``'s); ValueError naming the
        option (``block`` for ``block_size``/``block_rows``) and the allowed values."""
        kw = dict(options)
        block = kw.pop("block", None)
        fmt = FORMATS.get(kw.get("format", ""))
        if block is not None and fmt is not None:
            if fmt.block is None:
                raise ValueError(
                    f"block: {fmt.name} is scaled per tensor and takes no block; allowed: leave "
                    "block out"
                )
            rows, n = block
            kw["block_rows"] = rows
            if n != fmt.block:
                kw["block_size"] = n
        try:
            return cls(**kw)
        except ValueError as e:
            name, _, rest = str(e).partition(": ")
            raise ValueError(f"{'block' if name in _BLOCK_FIELDS else name}: {rest}") from None

    @classmethod
    def from_wire(cls, text: str) -> QuantSpec:
        """The spec ``wire`` wrote (``_wire``: JSON with ``'`` for its quotes)."""
        return cls(**json.loads(text.replace("'", '"')))

    def to_dict(self) -> dict[str, Any]:
        """The stored form (a run's ``config.json``, a cell's key): each field by its own name,
        those whose ``key`` is ``unless_default`` only where they differ from their default;
        ``QuantSpec(**d)`` inverts it."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if not f.init:
                continue
            v = getattr(self, f.name)
            if f.metadata.get("key") == "always" or v != f.default:
                out[f.name] = getattr(v, "value", v)
        return out

    def table_row(self) -> dict[str, Any]:
        """``options`` with the format's defaults filled in for rounding, prescale and block (what
        ``ablate recipe`` shows of an operand); other options where set."""
        row: dict[str, Any] = {
            "format": self.format,
            "rounding": self.rounding,
            "prescale": self.prescale,
            "block": [self.block_rows, self.block] if self.block else None,
        }
        return row | {k: v for k, v in self.options().items() if k not in row}


_OPTION_FIELDS = tuple(f for f in fields(QuantSpec) if f.init and f.name != "format")
_BLOCK_FIELDS = ("block_size", "block_rows")
OPTION_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys("block" if f.name in _BLOCK_FIELDS else f.name for f in _OPTION_FIELDS)
)
"""The operand options of the explicit form, in order (rounding, prescale, scale_mode, block,
scale_rule, outer_block)."""
FORMAT_OPTIONS: tuple[str, ...] = tuple(
    dict.fromkeys(
        "block" if f.name in _BLOCK_FIELDS else f.name
        for f in _OPTION_FIELDS
        if f.metadata["of_format"]
    )
)
"""The options that belong to a format: an override that changes the format drops them."""


def option_choices(name: str) -> tuple[str, ...] | None:
    """The allowed values of an option of the explicit form (None: any of its type)."""
    for f in _OPTION_FIELDS:
        if f.name == name:
            choices: tuple[str, ...] | None = f.metadata["choices"]
            return choices
    return None


def _wire(spec: QuantSpec) -> str:
    """``spec.wire`` (``QuantSpec.from_wire`` reads it back)."""
    out = {}
    for f in fields(spec):
        if f.init:
            v = getattr(spec, f.name)
            out[f.name] = getattr(v, "value", v)
    text = json.dumps(out, separators=(",", ":"))
    assert "'" not in text and "\\" not in text, text  # the fields' values are checked names
    return text.replace('"', "'")
