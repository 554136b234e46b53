"""Recipes: which format, rounding and Hadamard transform each operand of each GEMM uses.

A linear layer runs three GEMMs, each computing ``a @ b^T`` reduced over its own dimension:

    fprop  Y  = X  @ W^T   a = X  (tokens, in),  b = W    (out, in)     reduce over in_features
    dgrad  dX = dY @ W     a = dY (tokens, out), b = W^T  (in, out)     reduce over out_features
    wgrad  dW = dY^T @ X   a = dY^T (out, tokens), b = X^T (in, tokens) reduce over tokens

``GemmRecipe`` says how ``a`` and ``b`` of one GEMM are quantized (``None``: high precision) and which
Hadamard transform precedes the quantization; ``Recipe`` holds the three and the exemption of the
first/last transformer blocks. ``Recipe.from_shorthand`` builds the study vocabulary:

    fp4_gemms     which GEMMs run in FP4 (the rest run in ``base``: bf16, fp8, mxfp8)
    intervention  none | sr | rht[N] | dht[N] | fht[N] | sr+rht[N] | sr+dht[N] ... on those GEMMs,
                  its grammar in ``backends.recipes.intervention`` (N defaults to 16 there)
                  sr:  stochastic rounding with the 3/4 clip-free prescale on both operands
                  rht: random-sign Hadamard redrawn at every call (Tseng et al.)
                  dht: deterministic Hadamard, no signs (the H16 of the MXFP4 paper):
                       ``HadamardSpec(signs=DETERMINISTIC)``
                  fht: Hadamard with one fixed seeded sign vector per layer and GEMM

Its short string form, e.g. ``mxfp4[fprop,dgrad,wgrad]+dht16/fp8``, names runs and labels;
``GemmRecipe.intervention`` reads a GEMM's intervention back for the report's label.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from backends.quant import FORMATS, SIGN_POLICIES, QuantSpec, ScaleMode, SignPolicy
from backends.quant.rotation import DETERMINISTIC, Rotation, check_size
from backends.recipes.intervention import GEMMS, Gemm, Hadamard, Intervention, label, parse

if TYPE_CHECKING:
    import torch

OPERANDS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}
BASE_FORMATS = ("bf16", "fp8", "mxfp8")
LAYER_TYPES = ("attention", "mlp")
FP4_FORMATS = ("mxfp4", "nvfp4")


@dataclass(frozen=True, slots=True, kw_only=True)
class HadamardSpec:
    """A block-diagonal Hadamard transform along the GEMM's reduction dimension."""

    size: int = 16
    """Block size g: 16, 32, 64, 128 or 256."""
    signs: SignPolicy = DETERMINISTIC
    """none (``DETERMINISTIC``, the intervention dht): H itself, no signs; fixed (fht): one seeded
    sign vector per layer/GEMM; random (rht): redrawn per call."""
    vector: tuple[int, ...] | None = None
    """With ``signs="fixed"``: this one sign vector (``size`` entries of +-1) for every layer,
    instead of a seeded one per layer and GEMM (TransformerEngine's NVFP4 recipe hard-codes one)."""

    def __post_init__(self) -> None:
        check_size(self.size)
        if self.signs not in SIGN_POLICIES:
            raise ValueError(
                f"signs: unknown policy {self.signs!r}; allowed: {', '.join(SIGN_POLICIES)}"
            )
        if self.vector is not None:
            v = tuple(int(x) for x in self.vector)
            if self.signs != "fixed":
                raise ValueError(
                    f"vector: a sign vector goes with signs 'fixed', not {self.signs!r}"
                )
            if len(v) != self.size or any(x not in (1, -1) for x in v):
                raise ValueError(
                    f"vector: must be {self.size} entries of 1 or -1 (the Hadamard size), got "
                    f"{len(v)} entries"
                    + ("" if all(x in (1, -1) for x in v) else " with values other than +-1")
                )
            object.__setattr__(self, "vector", v)

    @classmethod
    def of(cls, h: Hadamard) -> HadamardSpec:
        """The transform an intervention's part names (``dht16``: size 16, signs none)."""
        return cls(size=h.size, signs=cast(SignPolicy, h.signs))  # checked in __post_init__

    def part(self) -> Hadamard:
        """This transform as an intervention names it (signs none: dht, fixed: fht, random: rht)."""
        return Hadamard.with_signs(self.signs, self.size)

    def short(self) -> str:
        return label(Intervention(hadamard=self.part()))

    def options(self) -> dict[str, Any]:
        """The transform in every form of a recipe: size, signs, and the sign vector where set."""
        d: dict[str, Any] = {"size": self.size, "signs": self.signs}
        if self.vector is not None:
            d["vector"] = list(self.vector)
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmRecipe:
    """Quantization of one GEMM's two operands (``None``: high precision, no quantization)."""

    a: QuantSpec | None = None
    b: QuantSpec | None = None
    hadamard: HadamardSpec | None = None
    high_precision: bool = field(init=False, repr=False, compare=False)
    """Neither operand quantized, no transform. An attribute, not a property: a traced model
    reads a bool attribute as a constant, where it traced the property's code at every call (a
    float or int attribute would not do: Dynamo makes one whose value changes between compiles,
    a recipe switched by a phase, a symbolic input)."""

    def __post_init__(self) -> None:
        hp = self.a is None and self.b is None and self.hadamard is None
        object.__setattr__(self, "high_precision", hp)
        if self.hadamard is not None and (self.a is None or self.b is None):
            raise ValueError("hadamard: a Hadamard transform needs both operands quantized")
        eden = [s for s in (self.a, self.b) if s is not None and s.rounding == "eden"]
        if eden and self.hadamard is None:
            raise ValueError(
                "hadamard: rounding eden (MS-EDEN) corrects its scales over the Hadamard group, "
                "so its GEMM needs a Hadamard transform (Quartet II: size 128, signs random)"
            )

    @property
    def is_fp4(self) -> bool:
        return any(s is not None and s.fmt.is_fp4 for s in (self.a, self.b))

    def rotation(self, signs: torch.Tensor | None) -> Rotation | None:
        """What the quantizer applies to both operands before quantizing them, for a call whose
        sign vector is ``signs`` (None for dht, ``DETERMINISTIC``): None without a transform."""
        return None if self.hadamard is None else Rotation(self.hadamard.size, signs)

    def intervention(self) -> Intervention:
        """What this GEMM does beyond quantizing (its part of the report's label): stochastic
        rounding or MS-EDEN where an operand rounds so, Four Over Six where one picks its block
        scales, and its Hadamard transform."""
        ops = [s for s in (self.a, self.b) if s is not None]
        return Intervention(
            sr=any(s.rounding == "sr" for s in ops),
            eden=any(s.rounding == "eden" for s in ops),
            four_over_six=any(s.scale_rule for s in ops),
            hadamard=None if self.hadamard is None else self.hadamard.part(),
        )

    @property
    def output_scale(self) -> float:
        """What the GEMM output is multiplied by to undo the operands' clip-free SR prescale:
        4/3 per prescaled operand (16/9 for both), as a native GEMM's alpha would."""
        comp = 1.0
        for s in (self.a, self.b):
            if s is not None:
                comp /= s.prescale_factor
        return comp

    def explicit(self, gemm: str) -> dict[str, Any]:
        """This GEMM in the canonical form: each operand under its tensor name (``OPERANDS``) as
        ``QuantSpec.options`` (``{"format": "bf16"}`` when high precision), and ``hadamard``
        where there is one."""
        out: dict[str, Any] = {
            op: {"format": "bf16"} if s is None else s.options()
            for op, s in zip(OPERANDS[gemm], (self.a, self.b), strict=True)
        }
        if self.hadamard is not None:
            out["hadamard"] = self.hadamard.options()
        return out

    @classmethod
    def from_explicit(cls, gemm: str, d: Mapping[str, Any]) -> GemmRecipe:
        """The GEMM of ``explicit``'s form; ValueError naming the operand and option."""
        specs: list[QuantSpec | None] = []
        for op in OPERANDS[gemm]:
            o = d.get(op) or {"format": "bf16"}
            try:
                specs.append(None if o["format"] == "bf16" else QuantSpec.from_options(o))
            except ValueError as e:
                raise ValueError(f"{op}.{e}") from None
        h = d.get("hadamard")
        if h is not None and h.get("vector") is not None:
            h = {**h, "vector": tuple(h["vector"])}
        return cls(a=specs[0], b=specs[1], hadamard=None if h is None else HadamardSpec(**h))

    def short(self) -> str:
        if self.high_precision:
            return "bf16"
        a = self.a.short() if self.a else "bf16"
        b = self.b.short() if self.b else "bf16"
        s = a if a == b else f"{a}|{b}"
        return s + (f"+{self.hadamard.short()}" if self.hadamard else "")


_BF16 = GemmRecipe()


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """The numerics of every quantized linear layer of a model."""

    fprop: GemmRecipe = _BF16
    dgrad: GemmRecipe = _BF16
    wgrad: GemmRecipe = _BF16
    keep_first: int = 0
    """The first N transformer blocks stay in high precision."""
    keep_last: int = 0
    """The last N transformer blocks stay in high precision."""
    layer_types: tuple[str, ...] | None = None
    """Only linears of these types follow the recipe (``attention``: the attention projections,
    ``mlp``: the feed-forward ones; see ``backends.layer.convert.layer_type``); None: every linear."""
    blocks: tuple[int, ...] | None = None
    """Only linears of these transformer blocks follow the recipe (negative: from the end);
    None: every block."""
    label: str | None = field(default=None, compare=False)
    """Short name (set by ``from_shorthand`` and the named recipes); derived from the GEMMs when
    None."""
    high_precision: bool = field(init=False, repr=False, compare=False)
    """Every GEMM high precision (an attribute: ``GemmRecipe.high_precision``)."""

    def __post_init__(self) -> None:
        hp = all(getattr(self, g).high_precision for g in GEMMS)
        object.__setattr__(self, "high_precision", hp)
        for name in ("keep_first", "keep_last"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.layer_types is not None:
            bad = [t for t in self.layer_types if t not in LAYER_TYPES]
            if bad or not self.layer_types or len(set(self.layer_types)) < len(self.layer_types):
                raise ValueError(
                    f"layers.types: {list(self.layer_types)} is not a list of distinct layer "
                    f"types; allowed: {', '.join(LAYER_TYPES)}"
                )
            order = tuple(t for t in LAYER_TYPES if t in self.layer_types)
            object.__setattr__(self, "layer_types", order)
        if self.blocks is not None:
            if not self.blocks or len(set(self.blocks)) < len(self.blocks):
                raise ValueError(
                    f"layers.blocks: {list(self.blocks)} must list distinct block indices "
                    "(negative ones count from the end); omit it for every block"
                )
            object.__setattr__(self, "blocks", tuple(int(b) for b in self.blocks))

    def gemm(self, name: str) -> GemmRecipe:
        if name not in GEMMS:
            raise ValueError(f"unknown GEMM {name!r}; allowed: {', '.join(GEMMS)}")
        g: GemmRecipe = getattr(self, name)
        return g

    def for_block(self, index: int | None, n_blocks: int | None) -> Recipe:
        """This recipe, or all-high-precision where block ``index`` of ``n_blocks`` is exempt
        (kept first/last, or not among ``blocks``)."""
        if index is None or n_blocks is None:
            return Recipe(label="bf16") if self.blocks is not None else self
        if index < self.keep_first or index >= n_blocks - self.keep_last:
            return Recipe(label="bf16")
        if self.blocks is not None and index not in {b % n_blocks for b in self.blocks}:
            return Recipe(label="bf16")
        return self

    def for_layer(self, layer_type: str | None, index: int | None, n_blocks: int | None) -> Recipe:
        """The recipe of one linear: of type ``layer_type`` (None: neither attention nor MLP) in
        block ``index`` of ``n_blocks``; all-high-precision where the selection leaves it out."""
        if self.layer_types is not None and layer_type not in self.layer_types:
            return Recipe(label="bf16")
        return self.for_block(index, n_blocks)

    def check_blocks(self, n_blocks: int) -> None:
        """Raise ValueError when ``blocks`` names a block a model of ``n_blocks`` does not have."""
        for i, b in enumerate(self.blocks or ()):
            if not -n_blocks <= b < n_blocks:
                raise ValueError(
                    f"layers.blocks[{i}]: block {b} does not exist in a model of {n_blocks} "
                    f"blocks; allowed: {-n_blocks} to {n_blocks - 1}"
                )

    def select(
        self,
        *,
        keep_first: int = 0,
        keep_last: int = 0,
        layer_types: Iterable[str] | None = None,
        blocks: Iterable[int] | None = None,
    ) -> Recipe:
        """This recipe (one without a selection of its own) on a subset of the layers, its label
        suffixed with the selection (``/keep0,2``, ``/mlp``, ``/blocks0,-1``)."""
        types = None if layer_types is None else tuple(layer_types)
        blk = None if blocks is None else tuple(blocks)
        r = replace(self, keep_first=keep_first, keep_last=keep_last, layer_types=types, blocks=blk)
        return replace(r, label=self.short() + selection_label(r))

    def short(self) -> str:
        if self.label is not None:
            return self.label
        if self.high_precision:
            return "bf16"
        return " ".join(f"{g}={self.gemm(g).short()}" for g in GEMMS)

    @classmethod
    def bf16(cls) -> Recipe:
        return cls(label="bf16")

    @classmethod
    def from_shorthand(
        cls,
        fp4_gemms: Iterable[str] = (),
        intervention: Intervention | str = "none",
        *,
        fp4_format: str = "mxfp4",
        base: str = "bf16",
        scale_mode: ScaleMode | str = ScaleMode.FLOOR,
        apply_to: Iterable[str] | None = None,
        keep_first: int = 0,
        keep_last: int = 0,
    ) -> Recipe:
        """The study vocabulary: FP4 on ``fp4_gemms``, ``intervention`` on those (or ``apply_to``),
        every other GEMM in ``base``. ``intervention`` as the study's schema parsed it, or a word of
        its grammar (``backends.recipes.intervention.parse``)."""
        fp4 = tuple(fp4_gemms)
        for g in fp4:
            if g not in GEMMS:
                raise ValueError(f"fp4_gemms: unknown GEMM {g!r}; allowed: {', '.join(GEMMS)}")
        if fp4_format not in FP4_FORMATS:
            raise ValueError(
                f"fp4_format: {fp4_format!r} is not an FP4 format; allowed: {', '.join(FP4_FORMATS)}"
            )
        if base not in BASE_FORMATS:
            raise ValueError(f"base: unknown {base!r}; allowed: {', '.join(BASE_FORMATS)}")
        iv = parse(intervention, shorthand=True) if isinstance(intervention, str) else intervention
        word = intervention if isinstance(intervention, str) else label(iv)
        if not iv.shorthand:
            raise ValueError(
                f"intervention: {word!r} is not a shorthand's (eden and 4over6 are quantizers of "
                "a named or explicit recipe); allowed: none, sr, rht, dht, fht and their "
                "combinations with '+'"
            )
        sr, had = iv.sr, None if iv.hadamard is None else HadamardSpec.of(iv.hadamard)
        targets = tuple(apply_to) if apply_to is not None else fp4
        for g in targets:
            if g not in GEMMS:
                raise ValueError(f"apply_to: unknown GEMM {g!r}; allowed: {', '.join(GEMMS)}")
        if (sr or had) and not targets:
            raise ValueError(
                f"intervention: {word!r} has no GEMM to act on (fp4_gemms is empty and "
                "apply_to is not set); use intervention 'none' for a recipe without FP4 GEMMs"
            )
        gemms: dict[str, GemmRecipe] = {}
        for g in GEMMS:
            if g in fp4:
                spec = QuantSpec(format=fp4_format, scale_mode=ScaleMode(scale_mode))
                r = GemmRecipe(a=spec, b=spec)
            else:
                r = base_gemm(g, base)
            if g in targets and (sr or had):
                if r.high_precision:
                    raise ValueError(
                        f"intervention: {word!r} applies to {g}, which runs in {base} "
                        "(high precision); apply interventions to quantized GEMMs only"
                    )
                a, b = r.a, r.b
                if sr:
                    a = replace(a, rounding="sr", prescale=True) if a else a
                    b = replace(b, rounding="sr", prescale=True) if b else b
                r = GemmRecipe(a=a, b=b, hadamard=had)
            gemms[g] = r
        name = f"{fp4_format}[{','.join(g for g in GEMMS if g in fp4)}]" if fp4 else base
        if sr or had:
            name += "+" + label(iv)
            if apply_to is not None:
                name += f"@{','.join(targets)}"
        if fp4:
            name += f"/{base}"
        if keep_first or keep_last:
            name += f"/keep{keep_first},{keep_last}"
        return cls(
            fprop=gemms["fprop"],
            dgrad=gemms["dgrad"],
            wgrad=gemms["wgrad"],
            keep_first=keep_first,
            keep_last=keep_last,
            label=name,
        )

    # ------------------------------------------------------------------------------------------
    # forms: the canonical explicit mapping, and what derives from it

    def explicit(self) -> dict[str, Any]:
        """The canonical form: the explicit per-GEMM, per-operand mapping a study's ``gemms:``
        writes, ``{gemm: {operand: options, "hadamard": {...}}}`` with each operand under its
        tensor name (fprop: x, w; dgrad: dy, w; wgrad: dy, x) as ``QuantSpec.options`` gives it.
        The layer selection and the label are the recipe's other fields."""
        return {g: self.gemm(g).explicit(g) for g in GEMMS}

    def table(self) -> dict[str, Any]:
        """The resolved table, operand by operand (what ``ablate recipe --json`` prints)::

            {"gemms": {"fprop"|"dgrad"|"wgrad": {"a": OPERAND, "b": OPERAND,
                                                 "hadamard": {"size", "signs"} | None}},
             "keep_first", "keep_last", "layers": {"types", "blocks"}}

        OPERAND is the operand's canonical options with ``operand`` (x, w or dy) and the defaults
        of rounding, prescale and block filled in (``QuantSpec.table_row``): ``{"operand",
        "format", "rounding", "prescale", "block": [rows, cols]}`` plus every other option where
        set (scale_rule, outer_block, ...); a high-precision operand has format ``bf16``, rounding
        None, block None; a per-tensor format has block None; prescale is false, true (3/4) or the
        factor. ``layers`` None entries mean every layer type / every block.
        """
        gemms: dict[str, Any] = {}
        for g in GEMMS:
            r = self.gemm(g)
            rows = [
                {
                    "operand": op,
                    "format": "bf16",
                    "rounding": None,
                    "prescale": False,
                    "block": None,
                }
                if s is None
                else {"operand": op, **s.table_row()}
                for op, s in zip(OPERANDS[g], (r.a, r.b), strict=True)
            ]
            h = r.hadamard
            gemms[g] = {
                "a": rows[0],
                "b": rows[1],
                "hadamard": None if h is None else {"size": h.size, "signs": h.signs},
            }
        return {
            "gemms": gemms,
            "keep_first": self.keep_first,
            "keep_last": self.keep_last,
            "layers": {
                "types": None if self.layer_types is None else list(self.layer_types),
                "blocks": None if self.blocks is None else list(self.blocks),
            },
        }

    def to_dict(self) -> dict[str, Any]:
        """The stored form (a run's ``config.json`` and params, a cell's key): per GEMM the
        operands ``a``, ``b`` as ``QuantSpec.to_dict`` and the Hadamard transform's options; the
        layer selection only where set. ``from_dict`` inverts it."""
        out: dict[str, Any] = {}
        for g in GEMMS:
            r = self.gemm(g)
            out[g] = {
                "a": None if r.a is None else r.a.to_dict(),
                "b": None if r.b is None else r.b.to_dict(),
                "hadamard": None if r.hadamard is None else r.hadamard.options(),
            }
        out["keep_first"], out["keep_last"], out["label"] = (
            self.keep_first,
            self.keep_last,
            self.label,
        )
        if self.layer_types is not None or self.blocks is not None:
            out["layers"] = {
                "types": None if self.layer_types is None else list(self.layer_types),
                "blocks": None if self.blocks is None else list(self.blocks),
            }
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Recipe:
        def spec(s: Mapping[str, Any] | None) -> QuantSpec | None:
            return None if s is None else QuantSpec(**s)

        gemms = {}
        for g in GEMMS:
            r = d.get(g) or {}
            h = r.get("hadamard")
            if h is not None and h.get("vector") is not None:
                h = {**h, "vector": tuple(h["vector"])}
            gemms[g] = GemmRecipe(
                a=spec(r.get("a")),
                b=spec(r.get("b")),
                hadamard=None if h is None else HadamardSpec(**h),
            )
        layers = d.get("layers") or {}
        types, blocks = layers.get("types"), layers.get("blocks")
        return cls(
            **gemms,
            keep_first=int(d.get("keep_first", 0)),
            keep_last=int(d.get("keep_last", 0)),
            layer_types=None if types is None else tuple(types),
            blocks=None if blocks is None else tuple(blocks),
            label=d.get("label"),
        )


def base_gemm(gemm: str, base: str) -> GemmRecipe:
    if base == "bf16":
        return _BF16
    if base == "fp8":  # the usual FP8 recipe: E4M3 for X and W, E5M2 for gradients
        e4, e5 = QuantSpec(format="fp8_e4m3"), QuantSpec(format="fp8_e5m2")
    else:
        e4 = e5 = QuantSpec(format="mxfp8_e4m3")
    a_op, b_op = OPERANDS[gemm]
    return GemmRecipe(a=e5 if a_op == "dy" else e4, b=e5 if b_op == "dy" else e4)


def selection_label(r: Recipe) -> str:
    """The label suffix of a layer selection: ``/keep0,2``, ``/mlp``, ``/blocks0,-1``."""
    out = f"/keep{r.keep_first},{r.keep_last}" if r.keep_first or r.keep_last else ""
    if r.layer_types is not None and set(r.layer_types) != set(LAYER_TYPES):
        out += "/" + "+".join(r.layer_types)
    if r.blocks is not None:
        out += "/blocks" + ",".join(map(str, r.blocks))
    return out


__all__ = [
    "BASE_FORMATS",
    "FORMATS",
    "FP4_FORMATS",
    "GEMMS",
    "Gemm",
    "LAYER_TYPES",
    "OPERANDS",
    "GemmRecipe",
    "HadamardSpec",
    "Recipe",
]
