"""Number formats: element formats (E2M1, E4M3, E5M2), scale formats (E8M0, E4M3), their codes.

Owns the bit-level definitions every other module relies on: the grid of each element format, how a
value in element units becomes a code and back, E8M0 scale codes, and the packing of two E2M1 codes
per byte in the layout of torch's ``float4_e2m1fn_x2`` (element 2i in the low nibble, 2i+1 in the high
nibble, as torchao's ``pack_uint4`` and the Blackwell GEMMs expect).

Element rounding itself lives in ``quantizer.py``; here a value must already be on the grid.

The formats themselves (``ElementFormat``, the constants, ``ScaleMode``) are plain Python: a study
names and checks its formats without torch, which the functions on tensors import when called.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "E2M1",
    "E4M3",
    "E5M2",
    "ELEMENT_FORMATS",
    "E8M0_NAN",
    "ElementFormat",
    "ScaleMode",
    "decode_e8m0",
    "element_format",
    "pack_fp4",
    "unpack_fp4",
]


_FP4_DTYPE = "float4_e2m1fn_x2"
"""torch's dtype of packed E2M1 codes, two per byte (torch decodes it with no arithmetic)."""


@dataclass(frozen=True, slots=True)
class ElementFormat:
    """A sign-magnitude minifloat without infinities (OCP MX element types).

    A value in element units is ``(-1)^s * 2^max(e, emin) * m`` with ``mbits`` fraction bits; the grid
    spacing in the binade ``[2^e, 2^(e+1))`` is ``2^(max(e, emin) - mbits)``.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    max: float  # largest finite magnitude
    dtype: str | None  # the name of torch's storage dtype for the codes, where it has one
    values: tuple[float, ...] = field(init=False, repr=False, compare=False)
    """The value of every code (index == code, sign bit included), for ``decode``; empty for the
    formats torch decodes itself (FP8)."""

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype != _FP4_DTYPE:
            object.__setattr__(self, "values", ())
            return
        sign = 1 << (self.bits - 1)
        mags = [self._magnitude(c & (sign - 1)) for c in range(1 << self.bits)]
        values = tuple(-m if c & sign else m for c, m in enumerate(mags))
        object.__setattr__(self, "values", values)

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """torch's storage dtype for the codes (``dtype``), where it has one."""
        import torch

        return None if self.dtype is None else getattr(torch, self.dtype)

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal (subnormals share its spacing)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest normal binade: the ``emax_elem`` of the OCP shared-scale rule,
        ``floor(log2(max))``, read exactly from the float's exponent (``max = m * 2^e``, ``0.5 <= m <
        1``). Plain Python: the quantizers ask at every call, and a compiled graph folds it."""
        return math.frexp(self.max)[1] - 1

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    def grid(self) -> torch.Tensor:
        """All non-negative finite values, ascending, as float64 (index == magnitude code)."""
        import torch

        codes = torch.arange(0, 1 << (self.ebits + self.mbits), dtype=torch.int64)
        vals = self._decode_magnitude(codes)
        return vals[vals <= self.max]

    def _magnitude(self, mag: int) -> float:
        """The value of a magnitude code (exact: a float64 holds every one)."""
        e, m = mag >> self.mbits, (mag & ((1 << self.mbits) - 1)) / (1 << self.mbits)
        return math.ldexp(1 + m, e - self.bias) if e > 0 else math.ldexp(m, self.emin)

    def _decode_magnitude(self, mag: torch.Tensor) -> torch.Tensor:
        import torch

        e = (mag >> self.mbits).to(torch.float64)
        m = (mag & ((1 << self.mbits) - 1)).to(torch.float64)
        normal = torch.ldexp(1 + m / (1 << self.mbits), (e - self.bias).to(torch.int64))
        sub = torch.ldexp(m / (1 << self.mbits), torch.full_like(mag, self.emin))
        return torch.where(e > 0, normal, sub)

    def encode(self, q: torch.Tensor) -> torch.Tensor:
        """Codes (uint8, sign in bit ``bits-1``) of values already on this grid.

        NaN (the elements of a non-finite block, whose scale carries the NaN) encodes canonically:
        0x7F for the FP8 types, 0 for E2M1, which has no NaN.
        """
        import torch

        nan = q.isnan()
        dtype = self.torch_dtype
        if dtype is not None and self.dtype != _FP4_DTYPE:
            return torch.where(nan, torch.nan, q).to(dtype).view(torch.uint8)
        # E2M1: the magnitude code is the index in the grid; -0 keeps its sign bit as in hardware.
        q = torch.where(nan, 0.0, q.float())
        sign = torch.signbit(q).to(torch.uint8) << (self.bits - 1)
        mag = torch.bucketize(q.abs().contiguous(), self.grid().float().to(q.device))
        return sign | mag.to(torch.uint8)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """float32 values of codes (inverse of ``encode``): torch's own FP8 types, E2M1 by a table
        of its 16 values (one gather; the arithmetic of ``_decode_magnitude`` per element took
        ten times as long on a CPU and a dozen nodes of every traced graph)."""
        import torch

        dtype = self.torch_dtype
        if dtype is not None and self.dtype != _FP4_DTYPE:
            return codes.view(dtype).float()
        return _value_table(self, codes.device)[codes.to(torch.int64)]


_TABLES: dict[tuple[str, torch.device], torch.Tensor] = {}


def _value_table(fmt: ElementFormat, device: torch.device) -> torch.Tensor:
    """``fmt.values`` as a float32 tensor on ``device``: made once per device (a copy to a GPU per
    call would wait for it), a constant of the graph inside a traced model."""
    import torch

    if torch.compiler.is_compiling():
        return torch.tensor(fmt.values, dtype=torch.float32, device=device)
    key = (fmt.name, device)
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = torch.tensor(fmt.values, dtype=torch.float32, device=device)
    return table


E2M1 = ElementFormat("e2m1", ebits=2, mbits=1, bias=1, max=6.0, dtype=_FP4_DTYPE)
E4M3 = ElementFormat("e4m3", ebits=4, mbits=3, bias=7, max=448.0, dtype="float8_e4m3fn")
E5M2 = ElementFormat("e5m2", ebits=5, mbits=2, bias=15, max=57344.0, dtype="float8_e5m2")
ELEMENT_FORMATS: dict[str, ElementFormat] = {f.name: f for f in (E2M1, E4M3, E5M2)}


def element_format(name: str) -> ElementFormat:
    try:
        return ELEMENT_FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown element format {name!r}; allowed: {', '.join(ELEMENT_FORMATS)}"
        ) from None


class ScaleMode(str, enum.Enum):
    """How an E8M0 block scale ``2^E`` is chosen from the block's absolute maximum ``amax``.

    Identical to torchao's ``ScaleCalculationMode``; ``emax`` is the element format's largest
    exponent (2 for E2M1, 8 for E4M3, 15 for E5M2):
    """

    FLOOR = "floor"
    """E = floor(log2(amax)) - emax. The OCP MX v1.0 rule; clips block maxima in [max, 2^(emax+1))."""
    CEIL = "ceil"
    """E = ceil(log2(amax)) - emax. Never clips, wastes range when amax is just above a power of 2."""
    EVEN = "even"
    """E = floor(log2(round(amax))) - emax, amax first rounded to the element's mantissa width
    (carry when its significand >= 2 - 2^-(mbits+1)): clips only what would round past max."""
    RCEIL = "rceil"
    """E = ceil(log2(fp32(amax / max))). NVIDIA's cuBLAS rule (cvt.rp.satfinite.ue8m0)."""


E8M0_NAN = 255
E8M0_BIAS = 127


def decode_e8m0(codes: torch.Tensor) -> torch.Tensor:
    """float32 ``2^(code-127)``; code 255 is NaN; code 0 is 2^-127 (an fp32 subnormal, exact)."""
    import torch

    e = codes.to(torch.int32) - E8M0_BIAS
    out = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e)
    return torch.where(codes.to(torch.int32) == E8M0_NAN, torch.nan, out)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes (uint8 in 0..15), last dim even, two per byte as ``float4_e2m1fn_x2``."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dimension, got shape {tuple(codes.shape)}")
    import torch

    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_fp4``: uint8 (or float4_e2m1fn_x2) bytes -> one code per byte."""
    import torch

    p = packed.view(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)
