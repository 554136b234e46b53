"""The quantizer as opaque ops in a compiled model (``backends.quant.ops``): inside a traced function each
quantization is one node (``ablate::quantize``, ``ablate::fake_quantize``, the emulated BF16 GEMM's
operands ``ablate::quantize_block_values`` and ``ablate::block_values``, and rht's per-call signs
``ablate::random_signs``), whose declared shapes, dtypes and strides are those of the tensors it
returns, and whose bits are the eager quantizer's, for every format and option (the 2026 variants
included); ``ABLATE_QUANT_OPS=0`` traces the arithmetic instead."""

from __future__ import annotations

import pytest
import torch

from backends.quant import FORMATS, QTensor, QuantSpec, fake_quantize, quantize, sign_vector
from backends.quant import ops as qops

SPECS = [QuantSpec(format=f) for f in FORMATS]
SPECS += [
    QuantSpec(format="mxfp4", rounding="sr", prescale=True),
    QuantSpec(format="nvfp4", rounding="sr"),
    QuantSpec(format="nvfp4", block_rows=16),
    QuantSpec(format="nvfp4", scale_rule="mse"),
    QuantSpec(format="nvfp4", outer_block=128),
    QuantSpec(format="nvfp4", rounding="eden"),
]
KEY = torch.tensor(1234, dtype=torch.int64)


FAKE_CHECKS = ("test_faketensor", "test_aot_dispatch_dynamic")
"""``torch.library.opcheck``'s checks of an op's declared outputs: at the input's sizes, and traced
at symbolic ones."""


def _hadamard(spec: QuantSpec) -> tuple[int, torch.Tensor] | None:
    if spec.rounding == "eden":  # MS-EDEN corrects its scales over the Hadamard group
        return (128, sign_vector(128, 7))
    return (16, sign_vector(16, 7)) if spec.format == "mxfp4" else None


def _graph_ops(fn, *args) -> list[str]:
    """The call_function targets of ``fn``'s Dynamo graph (aot_eager runs it)."""
    seen: list[str] = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return seen


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.short())
def test_a_traced_quantization_is_one_op_with_the_eager_bits(spec):
    torch._dynamo.reset()
    x = torch.randn(48, 256, generator=torch.Generator().manual_seed(0)) * 3
    h = _hadamard(spec)
    axis = 0 if spec.block_rows == 1 else 1  # a transposed view for the 1-D specs

    def both(t, key):
        q = qops.quantize(t, spec, axis, key, h)
        v = qops.fake_quantize(t, spec, axis, key, torch.bfloat16, h)
        return q, v

    ops = _graph_ops(lambda t, k: both(t, k)[1] + 0, x, KEY)
    assert (
        ops.count("ablate.quantize.default") == 1 and ops.count("ablate.fake_quantize.default") == 1
    )
    assert not any("bitwise" in o or "rshift" in o for o in ops)  # no quantizer arithmetic traced
    got_q, got_v = torch.compile(both, backend="aot_eager", fullgraph=True)(x, KEY)
    ref_q, ref_v = (
        quantize(x, spec, axis, KEY, h),
        fake_quantize(x, spec, axis, KEY, torch.bfloat16, h),
    )
    torch.testing.assert_close(got_v, ref_v, rtol=0, atol=0, equal_nan=True)
    assert isinstance(got_q, QTensor) and (got_q.axis, got_q.shape) == (ref_q.axis, ref_q.shape)
    for f in qops._FIELDS:
        a, b = getattr(got_q, f), getattr(ref_q, f)
        assert (a is None) == (b is None), f
        if a is not None:
            torch.testing.assert_close(a, b.to(a.device), rtol=0, atol=0, equal_nan=True)
    # the op's declared outputs (from the spec alone, or a variant's traced) are what it returns,
    # at static and symbolic sizes, a transposed view and a row count no 2-D tile divides
    size, signs = h or (0, None)
    for t, checks in (
        (x.movedim(axis, -1), FAKE_CHECKS),
        (x[:40].movedim(axis, -1), FAKE_CHECKS[:1]),
    ):
        torch.library.opcheck(
            qops._quantize_op, (t, KEY, signs, spec.wire, size), test_utils=checks
        )


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.outer_block], ids=lambda s: s.short())
def test_a_bf16_gemms_operand_is_one_op_with_the_eager_bits(spec):
    """The emulated BF16 GEMM's operand of a tensor (quantized, then its block values) and of a
    ``QTensor`` (its block values): one op each when traced, with the eager bits; the ops' declared
    outputs are what they return (``torch.library.opcheck``). Double-block NVFP4 has no block values
    (its scale per outer block): refused, as eagerly."""
    torch._dynamo.reset()
    x = torch.randn(48, 256, generator=torch.Generator().manual_seed(1)) * 3
    h = _hadamard(spec)
    bf16 = torch.bfloat16

    def both(t, key):
        fresh = qops.quantized_block_values(t, spec, 1, key, h, bf16)
        return fresh, qops.block_values(qops.quantize(t, spec, 1, key, h), bf16)

    ops = _graph_ops(lambda t, k: both(t, k)[0][0] + both(t, k)[1][0], x, KEY)
    assert ops.count("ablate.quantize_block_values.default") == 2
    assert ops.count("ablate.block_values.default") == 2
    (values, scale, amax), (values_q, scale_q) = torch.compile(
        both, backend="aot_eager", fullgraph=True
    )(x, KEY)
    q = quantize(x, spec, 1, KEY, h)
    ref_values, ref_scale = q.block_values(bf16)
    for got, ref in ((values, ref_values), (values_q, ref_values), (scale, ref_scale),
                     (scale_q, ref_scale), (amax, q.global_amax)):  # fmt: skip
        assert (got is None) == (ref is None)
        if ref is not None:
            torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    size, signs = h or (0, None)
    torch.library.opcheck(qops._quantize_block_values_op, (x, KEY, signs, spec.wire, size, bf16))
    fields = (q.codes, q.scales, q.global_dec, q.global_amax)
    torch.library.opcheck(qops._block_values_op, (*fields, spec.wire, 1, list(q.shape), bf16))


def test_a_bf16_gemms_operand_of_symbolic_size_has_the_eager_bits():
    """A compiled model whose batch changes size (a short last evaluation chunk) is traced again
    with symbolic sizes: the operand ops take them (their shapes are ``SymInt``) and return the
    eager bits at every size."""
    torch._dynamo.reset()
    for spec in (
        QuantSpec(format="nvfp4", rounding="sr"),
        QuantSpec(format="nvfp4", block_rows=16),
    ):

        def both(t, key, spec=spec):
            fresh = qops.quantized_block_values(t, spec, 1, key, None, torch.bfloat16)[0]
            return fresh, qops.block_values(qops.quantize(t, spec, 1, key), torch.bfloat16)[0]

        compiled = torch.compile(both, backend="aot_eager", fullgraph=True, dynamic=True)
        for rows in (16, 48, 32):
            x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
            for got, ref in zip(compiled(x, KEY), both(x, KEY), strict=True):
                torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_double_block_nvfp4_has_no_block_values_traced_or_not():
    spec = QuantSpec(format="nvfp4", outer_block=128)
    x = torch.randn(8, 256)
    fn = lambda t: qops.quantized_block_values(t, spec, 1, KEY, None, torch.bfloat16)[0]  # noqa: E731
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        with pytest.raises(Exception, match="scale per outer block"):
            f(x)


def test_an_ops_spec_argument_reads_back_and_needs_no_escape_in_c_plus_plus():
    """Inductor's C++ wrapper writes an op's string argument into a C++ string literal as it is:
    the spec's string holds no ``"`` and no backslash, for every format and option, and reads
    back as the spec it came from."""
    for spec in SPECS:
        assert '"' not in spec.wire and "\\" not in spec.wire, spec.wire
        assert qops._spec_of(spec.wire) == spec == QuantSpec.from_wire(spec.wire)


@pytest.mark.slow
def test_the_ops_compiled_with_inductors_cpp_wrapper_give_the_eager_bits():
    """Inductor's ``cpp_wrapper`` (a C++ wrapper instead of Python; ``TORCHINDUCTOR_CPP_WRAPPER=1``)
    builds the ops' calls and gives the eager bits (it failed to compile while the spec's string
    held ``"``). Without precompiled headers: on a fresh machine building the C++ wrapper's took
    about 20 s of ``g++``, more than this one compile reading the headers (about 12 s in all)."""
    torch._dynamo.reset()
    spec = QuantSpec(format="nvfp4", rounding="sr", block_rows=16)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)) * 3

    def both(t, key):
        q = qops.quantize(t, spec, 1, key, None)
        return q.codes, q.scales, qops.fake_quantize(t, spec, 1, key, torch.bfloat16, None)

    options = {"cpp_wrapper": True, "cpp_cache_precompile_headers": False}
    compiled = torch.compile(both, options=options, fullgraph=True)
    for got, ref in zip(compiled(x, KEY), both(x, KEY), strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("size", [16, 128])
def test_random_signs_are_one_op_with_the_eager_bits(size):
    """rht's signs, drawn per call from a key (data in a compiled graph, as the key tables give
    it): one node traced, the eager ``sign_vector``'s bits, declared output as returned."""
    torch._dynamo.reset()
    ops = _graph_ops(lambda k: qops.random_signs(size, k) * 2, KEY)
    assert ops.count("ablate.random_signs.default") == 1 and len(ops) == 2  # and the product
    compiled = torch.compile(lambda k: qops.random_signs(size, k), backend="aot_eager")
    for key in (KEY, torch.tensor(2**40 + 7, dtype=torch.int64)):  # (hashed from its low 32 bits)
        ref = sign_vector(size, key)
        torch.testing.assert_close(compiled(key), ref, rtol=0, atol=0)
        torch.testing.assert_close(qops.random_signs(size, int(key)), ref, rtol=0, atol=0)
    torch.library.opcheck(qops._random_signs_op, (KEY, size))


def test_with_quant_ops_off_the_arithmetic_is_traced_into_the_graph(monkeypatch):
    monkeypatch.setenv("ABLATE_QUANT_OPS", "0")
    torch._dynamo.reset()
    spec = QuantSpec(format="mxfp4", rounding="sr")
    x = torch.randn(8, 64)
    ops = _graph_ops(lambda t, k: qops.fake_quantize(t, spec, -1, k) + 0, x, KEY)
    assert "ablate.fake_quantize.default" not in ops and len(ops) > 50


def test_the_declared_outputs_are_computed_once_per_operand_size(monkeypatch):
    """The op's fake outputs (what a trace sees): shapes, dtypes and strides those of the real op's
    outputs, for every spec, at two sizes; from the spec alone for the plain quantizer, and for a
    variant from the fused path's arithmetic on fake tensors once per operand size, spec and
    rotation, then from a table."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from backends.quant import quantizer

    computed: list[str] = []
    fused = quantizer.quantize_fused

    def counted(xm, spec, *args, **kwargs):
        if isinstance(xm, FakeTensor):  # the real op runs it too, for the 2-D blocks and variants
            computed.append(spec.wire)
        return fused(xm, spec, *args, **kwargs)

    monkeypatch.setattr(quantizer, "quantize_fused", counted)
    monkeypatch.setattr(qops, "_metas", {})
    meta = lambda ts: [(tuple(t.shape), t.dtype, t.stride()) for t in ts]  # noqa: E731
    for rows in (48, 40):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
        for spec in SPECS:
            size, signs = _hadamard(spec) or (0, None)
            real = meta(qops._quantize_op(x, KEY, signs, spec.wire, size))
            for _ in range(2):
                with FakeTensorMode() as mode:
                    fx, fkey = mode.from_tensor(x), mode.from_tensor(KEY)
                    fsigns = None if signs is None else mode.from_tensor(signs)
                    fake = qops._quantize_op(fx, fkey, fsigns, spec.wire, size)
                assert meta(fake) == real, spec.short()
    variants = [s for s in SPECS if s.variant]
    assert len(computed) == 2 * len(variants) == len(qops._metas)  # never for a plain spec
    assert sorted(set(computed)) == sorted(s.wire for s in variants)


@pytest.mark.parametrize(
    "spec",
    [QuantSpec(format="mxfp4", rounding="sr"), QuantSpec(format="nvfp4", scale_rule="mse")],
    ids=lambda s: s.short(),
)
def test_an_operand_of_symbolic_size_is_declared_anew_each_time(spec):
    """Under dynamic shapes the fake outputs are computed for the symbolic sizes (a variant's never
    from the table of concrete ones, nor stored in it), and the compiled op returns the eager
    bits."""
    torch._dynamo.reset()
    kept = dict(qops._metas)

    def codes(t, key):
        return qops.quantize(t, spec, -1, key).codes

    compiled = torch.compile(codes, backend="aot_eager", fullgraph=True, dynamic=True)
    for rows in (8, 24):
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(
            compiled(x, KEY), quantize(x, spec, -1, KEY).codes, rtol=0, atol=0
        )
    assert qops._metas == kept
