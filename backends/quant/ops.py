"""The quantizer as opaque torch ops, for models that ``torch.compile`` traces.

``quantize`` and ``fake_quantize`` here take the arguments of ``quantizer.quantize`` and
``quantizer.fake_quantize`` and return the same bits; ``block_values(t, dtype)`` is
``t.block_values(dtype)`` and ``quantized_block_values`` the two steps (the emulated BF16 GEMM's
operands); ``random_signs`` is ``hadamard.sign_vector`` (rht's signs, drawn per call). Called
eagerly they *are* those functions. Called while Dynamo traces a model
(``torch.compiler.is_compiling()``), each becomes one call of a custom op (``ablate::quantize``,
``ablate::fake_quantize``, ``ablate::block_values``, ``ablate::quantize_block_values``,
``ablate::random_signs``) that the graph holds as a single node; at run time the op calls the eager
function (the C kernel on the CPU; on CUDA the fused kernels that ``torch_path.compiled`` builds
once per quantizer plan and shares between every layer and GEMM).

Why not trace the quantizer into the model's graph: its branch-free arithmetic is 100-200 graph
nodes per operand (``torch_path.py``), and a transformer block quantizes 42 operands (7 linears x 3
GEMMs x 2), so a block's graph grows from about 100 nodes to about 6,000, and Inductor's lowering
time with it: one MXFP4 block took 6-15 minutes to compile on a 2-core CPU, where the opaque op
compiles the block in well under a minute and each quantizer plan once. The price is one Python call
per quantized operand per step (the op's dispatch and the compiled kernel's guard check) and no
fusion of the quantizer with the op that produced its input; the bits are the same either way.

Traced inline instead (``set_traced_inline(True)``: the trainer's ``RunConfig.quantizer_graph``,
whose ``auto`` traces inline on CUDA; or, for a caller without a trainer, ``ABLATE_QUANT_OPS=0``),
the quantizer fuses with its neighbours and costs no Python call: on an H200 (torch 2.11, 125m,
16,384 tokens a step) the emulated full-MXFP4 step took 151.0 ms with the opaque ops, the device
busy 0.47 of it (about 200 us of host work per quantized operand, 432 a step), and 64.9 ms inline,
busy 0.99, for a 42 s compile instead of 23 s. ``torch_path.py``'s arithmetic compiles under
Inductor bit for bit (``tests/backends/quant/test_quant.py``); a compiled step differs from the
eager one where the compiler fuses the high-precision arithmetic around the quantizer, either way.

The ops quantize along the last dimension of their input (the caller moves the axis there and back,
views that Dynamo traces); a spec travels as a JSON string of its fields, which is stable across
processes, so a graph cached on disk by Inductor means the same quantizer in the next process.
"""

from __future__ import annotations

import functools

import torch

from backends.env import flag
from backends.quant import quantizer
from backends.quant.hadamard import sign_vector
from backends.quant.operand import QuantSpec
from backends.quant.qtensor import QTensor
from backends.quant.rotation import Rotation, rotation

__all__ = [
    "block_values",
    "check_env",
    "fake_quantize",
    "quantize",
    "quantized_block_values",
    "random_signs",
    "set_traced_inline",
    "traced_inline",
]


_inline: bool | None = None


def set_traced_inline(inline: bool | None) -> None:
    """Whether models compiled from now on in this process trace the quantizer into their graph
    (True) or call the opaque ops (False); None: as ``ABLATE_QUANT_OPS`` says (the trainer sets it
    from ``RunConfig.quantizer_graph`` before it compiles a model)."""
    global _inline
    _inline = inline


def traced_inline() -> bool:
    """Whether a compiled model traces the quantizer into its graph instead of calling the opaque
    ops: ``set_traced_inline``'s choice, else ``ABLATE_QUANT_OPS=0`` (an on/off switch,
    ``backends.env.flag``; another value raises ``ValueError``)."""
    if _inline is not None:
        return _inline
    return not flag("ABLATE_QUANT_OPS", True)


def check_env() -> None:
    """Raise ``ValueError`` if ``ABLATE_QUANT_OPS`` is set to a value it does not allow."""
    flag("ABLATE_QUANT_OPS", True)


def _spec_arg(spec: QuantSpec) -> str:
    """``spec`` as the string the ops take (``QuantSpec.wire``: a constant in the graph, JSON with
    ``'`` for its quotes)."""
    return spec.wire


@functools.cache
def _spec_of(arg: str) -> QuantSpec:
    return QuantSpec.from_wire(arg)


def _had(size: int, signs: torch.Tensor | None) -> Rotation | None:
    """The op's ``(signs, hadamard)`` arguments as the quantizer's ``Rotation`` (size 0: none)."""
    return Rotation(size, signs) if size else None


_FIELDS = ("codes", "scales", "global_dec", "global_amax", "outer_scales")
"""The tensors of a ``QTensor``, in the order the quantize op returns them."""


def _absent(x: torch.Tensor) -> torch.Tensor:
    """The placeholder of a field that is None (custom ops return tensors, never None): an empty
    bool tensor, a dtype no field has."""
    return x.new_empty((0,), dtype=torch.bool)


def _present(t: torch.Tensor) -> torch.Tensor | None:
    """One of the quantize op's outputs, None where it stands for an absent one (``_absent``)."""
    return None if t.dtype == torch.bool else t


@torch.library.custom_op("ablate::quantize", mutates_args=())
def _quantize_op(
    xm: torch.Tensor, key: torch.Tensor, signs: torch.Tensor | None, spec: str, hadamard: int
) -> list[torch.Tensor]:
    """``quantizer.quantize(xm, spec, -1, key, hadamard)``'s tensors (``_FIELDS``), each contiguous on
    ``xm``'s device, ``_absent`` where None."""
    return _outputs(quantizer.quantize(xm, _spec_of(spec), -1, key, _had(hadamard, signs)), xm)


def _outputs(q: QTensor, xm: torch.Tensor) -> list[torch.Tensor]:
    fields = (getattr(q, f) for f in _FIELDS)
    return [_absent(xm) if t is None else t.to(xm.device).contiguous() for t in fields]


_Meta = tuple[tuple[tuple[int, ...], torch.dtype], ...]
_metas: dict[tuple[object, ...], _Meta] = {}
_METAS_KEPT = 4096


def _traced_outputs(
    xm: torch.Tensor, key: torch.Tensor, signs: torch.Tensor | None, spec: str, hadamard: int
) -> list[torch.Tensor]:
    """The fused path's arithmetic on fake tensors: the exact output shapes and dtypes."""
    q = quantizer.quantize_fused(xm, _spec_of(spec), -1, key, _had(hadamard, signs), compile=False)
    return _outputs(q, xm)


def _plain_outputs(xm: torch.Tensor, s: QuantSpec, hadamard: int) -> list[torch.Tensor] | None:
    """The quantize op's outputs from the spec alone, for the quantizer without a ``variants``
    option (``torch_path.run``'s layout): codes (..., Kp) uint8, Kp the last dimension padded to
    the rotation's size and then to whole blocks; block scale codes (..., Kp / block) uint8 for MX
    and NVFP4 (2-D tiles too: a tile's scale repeated on its rows); a float32 scalar tensor decode
    scale but for MX; a float32 scalar amax for NVFP4. None for a variant (its own layout)."""
    if s.variant:
        return None
    shape = _padded(xm.shape, hadamard)
    block = s.block or shape[-1]
    shape = _padded(shape, block)
    scale = s.fmt.scale
    scales = [*shape[:-1], shape[-1] // block]
    return [
        xm.new_empty(shape, dtype=torch.uint8),
        _absent(xm) if scale == "tensor" else xm.new_empty(scales, dtype=torch.uint8),
        _absent(xm) if scale == "e8m0" else xm.new_empty((), dtype=torch.float32),
        xm.new_empty((), dtype=torch.float32) if scale == "nv" else _absent(xm),
        _absent(xm),
    ]


@_quantize_op.register_fake
def _(
    xm: torch.Tensor, key: torch.Tensor, signs: torch.Tensor | None, spec: str, hadamard: int
) -> list[torch.Tensor]:
    # From the spec alone for the plain quantizer: tracing the fused path took about a second per
    # new operand size, and every call at symbolic sizes (on a 2-core CPU: the compile rehearsal's
    # nvidia_nvfp4 model 14.4 -> 13.1 s, two NVFP4 operands compiled at symbolic sizes 21 -> 8 s).
    # A variant is traced once per operand (about 100 fake ops), then read from a table, for every
    # block's operands of the same sizes and for AOTAutograd's trace after Dynamo's
    plain = _plain_outputs(xm, _spec_of(spec), hadamard)
    if plain is not None:
        return plain
    shape = tuple(xm.shape)
    if not all(type(d) is int for d in shape):  # symbolic sizes: traced every time
        return _traced_outputs(xm, key, signs, spec, hadamard)
    k = (shape, xm.dtype, xm.device, spec, hadamard, signs is None)
    meta = _metas.get(k)
    if meta is None:
        outs = _traced_outputs(xm, key, signs, spec, hadamard)
        meta = tuple((tuple(t.shape), t.dtype) for t in outs)
        if len(_metas) >= _METAS_KEPT:
            _metas.clear()
        _metas[k] = meta
    return [xm.new_empty(s, dtype=d) for s, d in meta]


@torch.library.custom_op("ablate::fake_quantize", mutates_args=())
def _fake_quantize_op(
    xm: torch.Tensor,
    key: torch.Tensor,
    signs: torch.Tensor | None,
    spec: str,
    hadamard: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``quantizer.fake_quantize(xm, spec, -1, key, out_dtype, hadamard)``, contiguous."""
    out = quantizer.fake_quantize(xm, _spec_of(spec), -1, key, out_dtype, _had(hadamard, signs))
    return out.contiguous()


@_fake_quantize_op.register_fake
def _(
    xm: torch.Tensor,
    key: torch.Tensor,
    signs: torch.Tensor | None,
    spec: str,
    hadamard: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return xm.new_empty(_padded(xm.shape, hadamard), dtype=out_dtype)


def _key(key: int | torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    """The ops' key argument: a tensor key as it is, an int one as an int64 scalar on ``device``."""
    if isinstance(key, torch.Tensor):
        return key
    return torch.full((), key & 0xFFFFFFFF, dtype=torch.int64, device=device)


def _op_args(
    x: torch.Tensor, axis: int, key: int | torch.Tensor, hadamard: Rotation | None
) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """What an op on ``x`` along ``axis`` takes: (the axis, non-negative; ``x`` with it moved last;
    the key tensor; the rotation's signs; its size, 0 for none)."""
    axis = axis % x.dim()
    rot = rotation(hadamard)
    size, signs = (rot.size, rot.signs) if rot is not None else (0, None)
    return axis, x.detach().movedim(axis, -1), _key(key, x.device), signs, size


def _padded(shape: torch.Size | list[int], size: int) -> list[int]:
    """``shape`` with its last dimension padded to a multiple of a rotation's ``size`` (0: none)."""
    out = list(shape)
    if size:
        out[-1] = -(-out[-1] // size) * size
    return out


def _opaque() -> bool:
    return torch.compiler.is_compiling() and not traced_inline()


def quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    key: int | torch.Tensor = 0,
    hadamard: Rotation | None = None,
) -> QTensor:
    """``quantizer.quantize``; one opaque op inside a traced model (module docstring)."""
    if not _opaque():
        return quantizer.quantize(x, spec, axis, key, hadamard)
    axis, xm, k, signs, size = _op_args(x, axis, key, hadamard)
    ts = _quantize_op(xm, k, signs, _spec_arg(spec), size)
    codes, scales, global_dec, global_amax, outer_scales = ts  # _FIELDS' order
    shape = list(x.shape)
    if size:
        shape[axis] = -(-shape[axis] // size) * size
    return QTensor(
        codes=codes,
        scales=_present(scales),
        global_dec=_present(global_dec),
        global_amax=_present(global_amax),
        outer_scales=_present(outer_scales),
        spec=spec,
        axis=axis,
        shape=tuple(shape),
    )


def _scale_fake(
    spec: QuantSpec, like: torch.Tensor, global_dec: torch.Tensor | None, amax: torch.Tensor | None
) -> torch.Tensor:
    """The fake of ``QTensor.block_values``' tensor-level scale (``_absent`` where None)."""
    if spec.fmt.scale == "e8m0":  # MX: the values are dequantized, no tensor scale
        return _absent(like)
    if spec.nv_top is None:  # per-tensor FP8, MS-EDEN: the tensor decode scale
        assert global_dec is not None
        return global_dec.new_empty(global_dec.shape)
    assert amax is not None  # NVFP4: amax * fp32(1/top)
    return amax.new_empty(amax.shape, dtype=torch.float32)


def _copy(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """An op's output that is not its input: a copy of ``t`` on ``like``'s device, or
    ``_absent``."""
    return _absent(like) if t is None else t.to(like.device, copy=True)


@torch.library.custom_op("ablate::block_values", mutates_args=())
def _block_values_op(
    codes: torch.Tensor,
    scales: torch.Tensor | None,
    global_dec: torch.Tensor | None,
    global_amax: torch.Tensor | None,
    spec: str,
    axis: int,
    shape: list[int],
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    """``QTensor.block_values(dtype)`` of the ``QTensor`` of these fields (no outer scales): the
    values, contiguous, and the tensor-level scale (``_absent`` where None)."""
    q = QTensor(codes, scales, global_dec, _spec_of(spec), axis, tuple(shape), global_amax)
    values, scale = q.block_values(dtype)
    return [values.contiguous(), _copy(scale, codes)]


@_block_values_op.register_fake
def _(
    codes: torch.Tensor,
    scales: torch.Tensor | None,
    global_dec: torch.Tensor | None,
    global_amax: torch.Tensor | None,
    spec: str,
    axis: int,
    shape: list[int],
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    scale = _scale_fake(_spec_of(spec), codes, global_dec, global_amax)
    return [codes.new_empty(shape, dtype=dtype), scale]


@torch.library.custom_op("ablate::quantize_block_values", mutates_args=())
def _quantize_block_values_op(
    xm: torch.Tensor,
    key: torch.Tensor,
    signs: torch.Tensor | None,
    spec: str,
    hadamard: int,
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    """``quantizer.quantize(xm, spec, -1, key, hadamard)``'s ``block_values(dtype)`` and
    ``global_amax``: the values (contiguous), the tensor-level scale and the amax (``_absent``
    where None)."""
    q = quantizer.quantize(xm, _spec_of(spec), -1, key, _had(hadamard, signs))
    values, scale = q.block_values(dtype)
    return [values.contiguous(), _copy(scale, xm), _copy(q.global_amax, xm)]


@_quantize_block_values_op.register_fake
def _(
    xm: torch.Tensor,
    key: torch.Tensor,
    signs: torch.Tensor | None,
    spec: str,
    hadamard: int,
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    # from the spec alone, not by tracing the quantizer as ``ablate::quantize``'s fake does (a
    # compiled NVFP4 model of test size: 12.4 s -> 10.0 s): a tensor decode scale (global_dec) is a
    # float32 scalar for every format but MX's, an amax one for NVFP4's ("nv") scales
    s = _spec_of(spec)
    scalar = xm.new_empty((), dtype=torch.float32)
    amax = scalar if s.fmt.scale == "nv" else None
    dec = None if s.fmt.scale == "e8m0" else scalar
    values = xm.new_empty(_padded(xm.shape, hadamard), dtype=dtype)
    return [values, _scale_fake(s, xm, dec, amax), _copy(amax, xm)]


def block_values(t: QTensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``t.block_values(dtype)``; one opaque op inside a traced model (module docstring)."""
    if not _opaque() or t.outer_scales is not None:  # (the latter raises block_values' error)
        return t.block_values(dtype)
    wire = _spec_arg(t.spec)
    args = (t.codes, t.scales, t.global_dec, t.global_amax, wire, t.axis, list(t.shape), dtype)
    values, scale = _block_values_op(*args)
    return values, _present(scale)


def quantized_block_values(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    key: int | torch.Tensor,
    hadamard: Rotation | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``q = quantize(x, spec, axis, key, hadamard)``'s ``q.block_values(dtype)`` and
    ``q.global_amax``, as (values, tensor-level scale, amax): the emulated BF16 GEMM's operand.
    Inside a traced model one opaque op, where the two steps would be the quantize op, a
    ``QTensor`` and about ten traced nodes of decode per operand (a compiled NVFP4 model of test
    size: 18.3 s -> 10.0 s on a 2-core CPU, the same bits)."""
    if not _opaque() or spec.outer_block:  # (the latter raises block_values' error)
        q = quantizer.quantize(x, spec, axis, key, hadamard)
        values, scale = q.block_values(dtype)
        return values, scale, q.global_amax
    axis, xm, k, signs, size = _op_args(x, axis, key, hadamard)
    values, scale, amax = _quantize_block_values_op(xm, k, signs, _spec_arg(spec), size, dtype)
    return values.movedim(-1, axis), _present(scale), _present(amax)


@torch.library.custom_op("ablate::random_signs", mutates_args=())
def _random_signs_op(key: torch.Tensor, size: int) -> torch.Tensor:
    """``hadamard.sign_vector(size, key)`` on ``key``'s device."""
    return sign_vector(size, key, device=key.device)


@_random_signs_op.register_fake
def _(key: torch.Tensor, size: int) -> torch.Tensor:
    return key.new_empty((size,), dtype=torch.float32)


def random_signs(
    size: int, key: int | torch.Tensor, device: torch.device | str | None = None
) -> torch.Tensor:
    """``hadamard.sign_vector(size, key, device)``: a random Hadamard transform's signs, drawn per
    call from the call's key; one opaque op inside a traced model, where the draw is three rounds of
    a 32-bit hash, about 30 integer nodes per GEMM (a compiled MXFP4 + RHT16 model of test size:
    15.1 s -> 10.8 s on a 2-core CPU, the same bits)."""
    if not _opaque():
        return sign_vector(size, key, device=device)
    return _random_signs_op(_key(key, device).to(device), size)


def fake_quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    key: int | torch.Tensor = 0,
    out_dtype: torch.dtype | None = None,
    hadamard: Rotation | None = None,
) -> torch.Tensor:
    """``quantizer.fake_quantize``; one opaque op inside a traced model (module docstring)."""
    if not _opaque():
        return quantizer.fake_quantize(x, spec, axis, key, out_dtype, hadamard)
    od = out_dtype or (torch.float32 if hadamard is not None else x.dtype)
    axis, xm, k, signs, size = _op_args(x, axis, key, hadamard)
    out = _fake_quantize_op(xm, k, signs, _spec_arg(spec), size, od)
    return out.movedim(-1, axis)
