"""Block-diagonal Hadamard transforms (``backends.quant.hadamard``): orthogonality, exact cancellation in a
GEMM, sign policies, argument checks. Products are checked in float64."""

from __future__ import annotations

import math

import pytest
import torch

from backends.quant import (
    SIZES,
    hadamard_matrix,
    hadamard_transform,
    hadamard_transform_reference,
    sign_vector,
)
from backends.quant import ckernel as _kernel
from backends.quant.rng import derive_key

G = torch.Generator()


@pytest.fixture(autouse=True)
def _reseed():
    G.manual_seed(0)  # each test sees the same values whatever runs before it


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G, dtype=torch.float64)


def _assert_product_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    # float64 round-off of a length-K dot product is ~1e-16 * K * |terms|; 1e-12 relative is tight
    scale = float(expected.abs().max())
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("size", SIZES)
def test_hadamard_matrix_is_orthogonal(size):
    h = hadamard_matrix(size, torch.float64)
    torch.testing.assert_close(h @ h.T, torch.eye(size, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(h, h.T, rtol=0, atol=0)  # Sylvester H is symmetric


@pytest.mark.parametrize("size", SIZES)
def test_hadamard_matrix_is_sylvester(size):
    # Sylvester's construction: H[i, j] = (-1)^popcount(i & j), normalized by 1/sqrt(size)
    i = torch.arange(size)
    parity = torch.zeros(size, size, dtype=torch.int64)
    a = i[:, None] & i[None, :]
    while bool(a.any()):
        parity ^= a & 1
        a = a >> 1
    expected = (1 - 2 * parity).double() / math.sqrt(size)
    torch.testing.assert_close(hadamard_matrix(size, torch.float64), expected, rtol=0, atol=0)


@pytest.mark.parametrize("size", SIZES)
def test_transform_of_a_basis_vector_is_a_signed_row_of_h(size):
    signs = sign_vector(size, derive_key(5))
    x = torch.zeros(2, size, dtype=torch.float64)
    x[0, 3] = 1.0
    x[1, size - 1] = 1.0
    y = hadamard_transform(x, axis=-1, size=size, signs=signs)
    h = hadamard_matrix(size, torch.float64)
    # y = x diag(signs) H / sqrt(size): e_i -> signs[i] * H[i]
    torch.testing.assert_close(y[0], float(signs[3]) * h[3], rtol=0, atol=0)
    torch.testing.assert_close(y[1], float(signs[size - 1]) * h[size - 1], rtol=0, atol=0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("K", [256, 40, 300], ids=lambda k: f"K{k}")
def test_transform_on_both_operands_leaves_the_product_unchanged(size, K):
    a, b = _randn(5, K), _randn(7, K)
    ha = hadamard_transform(a, axis=-1, size=size)
    hb = hadamard_transform(b, axis=-1, size=size)
    assert ha.dtype == torch.float64
    assert ha.shape == (5, -(-K // size) * size)  # zero-padded reduction dimension
    _assert_product_close(ha @ hb.T, a @ b.T)


@pytest.mark.parametrize("size", [16, 64, 256])
@pytest.mark.parametrize("K", [128, 50], ids=lambda k: f"K{k}")
def test_transform_along_axis_0_leaves_the_product_unchanged(size, K):
    # the wgrad GEMM reduces over tokens, the first axis: dW = dY^T X
    dy, x = _randn(K, 6), _randn(K, 9)
    hdy = hadamard_transform(dy, axis=0, size=size)
    hx = hadamard_transform(x, axis=0, size=size)
    assert hdy.shape == (-(-K // size) * size, 6)
    _assert_product_close(hdy.T @ hx, dy.T @ x)


def test_transform_along_a_middle_axis_equals_transform_of_moved_tensor():
    x = _randn(3, 48, 5)
    y = hadamard_transform(x, axis=1, size=16)
    expected = hadamard_transform(x.movedim(1, -1), axis=-1, size=16).movedim(-1, 1)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_transform_is_block_diagonal():
    # each group of `size` elements is transformed on its own: changing group 1 leaves group 0 alone
    x = _randn(2, 64)
    x2 = x.clone()
    x2[:, 32:] = _randn(2, 32)
    y, y2 = hadamard_transform(x, -1, 32), hadamard_transform(x2, -1, 32)
    torch.testing.assert_close(y[:, :32], y2[:, :32], rtol=0, atol=0)
    assert not torch.allclose(y[:, 32:], y2[:, 32:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_input_is_transformed_in_float32(dtype):
    x = _randn(4, 32).to(dtype)
    y = hadamard_transform(x, axis=-1, size=32)
    assert y.dtype == torch.float32
    expected = x.double() @ hadamard_matrix(32, torch.float64)
    torch.testing.assert_close(y.double(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("signed", [False, True], ids=["H", "DH"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("size", [16, 128])
def test_fast_transform_equals_reference_bit_for_bit(size, dtype, signed):
    # the C kernel (CPU, 32/16-bit inputs) and the torch butterfly run the same float32 operations
    assert _kernel.available()
    signs = sign_vector(size, derive_key(11)) if signed else None
    cases = [
        (_randn(5, 2 * size), -1),
        (_randn(5, size + 24), -1),  # ragged: zero-padded
        (_randn(size + 8, 6), 0),  # ragged, along the first axis (strided)
        (_randn(3, size, 5), 1),  # middle axis
        (_randn(2 * size, 7).t(), -1),  # transposed view
        (_randn(7, size).t(), 0),  # transposed view, contiguous once the axis is last
    ]
    for x, axis in cases:
        x = x.to(dtype)
        fast = hadamard_transform(x, axis, size, signs)
        ref = hadamard_transform_reference(x, axis, size, signs)
        assert fast.dtype == torch.float32 and fast.shape == ref.shape
        assert torch.equal(fast.view(torch.int32), ref.view(torch.int32))


@pytest.mark.parametrize("axis", [-1, 0])
def test_float32_transform_keeps_the_product_to_float32_accuracy(axis):
    a, b = _randn(300, 8).float(), _randn(300, 12).float()
    if axis == -1:
        a, b = a.t(), b.t()
    ha, hb = hadamard_transform(a, axis, 64), hadamard_transform(b, axis, 64)
    got = (ha.t() @ hb if axis == 0 else ha @ hb.t()).double()
    exact = a.double().t() @ b.double() if axis == 0 else a.double() @ b.double().t()
    # float32 round-off of the transform and the K = 320 dot products: ~1e-6 relative
    torch.testing.assert_close(got, exact, rtol=0, atol=1e-5 * float(exact.abs().max()))


# ----------------------------------------------------------------------------------------------
# sign policies


@pytest.mark.parametrize("size", SIZES)
def test_sign_vector_is_plus_minus_one_and_reproducible(size):
    s = sign_vector(size, derive_key(1, 2, 3))
    assert s.shape == (size,) and s.dtype == torch.float32
    assert set(s.tolist()) <= {-1.0, 1.0}
    assert torch.equal(s, sign_vector(size, derive_key(1, 2, 3)))
    n_neg = int((s < 0).sum())
    assert 0 < n_neg < size  # both signs occur (P(all equal) = 2^(1-size), and the key is fixed)


@pytest.mark.parametrize("size", [16, 64, 256])
def test_sign_vector_differs_across_keys(size):
    vecs = {tuple(sign_vector(size, derive_key(7, 0, 1, 1, step)).tolist()) for step in range(10)}
    assert len(vecs) == 10


def test_signs_change_the_output():
    x = _randn(4, 64)
    signs = sign_vector(32, derive_key(3))
    assert not torch.allclose(
        hadamard_transform(x, -1, 32, signs=signs), hadamard_transform(x, -1, 32)
    )


@pytest.mark.parametrize("size", [16, 128])
@pytest.mark.parametrize("K", [256, 72], ids=lambda k: f"K{k}")
def test_same_signs_on_both_operands_keep_the_product_exact(size, K):
    a, b = _randn(5, K), _randn(6, K)
    signs = sign_vector(size, derive_key(9, 1))
    ha = hadamard_transform(a, -1, size, signs=signs)
    hb = hadamard_transform(b, -1, size, signs=signs)
    _assert_product_close(ha @ hb.T, a @ b.T)


def test_different_signs_on_the_two_operands_break_the_product():
    # the cancellation needs the SAME diag(signs) on both sides: (A D1 H)(B D2 H)^T != A B^T
    a, b = _randn(5, 64), _randn(6, 64)
    ha = hadamard_transform(a, -1, 32, signs=sign_vector(32, derive_key(1)))
    hb = hadamard_transform(b, -1, 32, signs=sign_vector(32, derive_key(2)))
    assert float((ha @ hb.T - a @ b.T).abs().max()) > 1e-3


# ----------------------------------------------------------------------------------------------
# argument checks


@pytest.mark.parametrize("size", [8, 24, 512, 0])
def test_unsupported_size_raises_listing_allowed_sizes(size):
    for call in (
        lambda: hadamard_transform(torch.zeros(2, 64), -1, size),
        lambda: hadamard_matrix(size),
        lambda: sign_vector(size, 0),
    ):
        with pytest.raises(ValueError, match="allowed: 16, 32, 64, 128, 256"):
            call()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_integer_tensor_raises_type_error(dtype):
    with pytest.raises(TypeError, match=str(dtype)):
        hadamard_transform(torch.zeros(2, 32, dtype=dtype), -1, 16)


def test_signs_of_the_wrong_shape_raise():
    with pytest.raises(ValueError, match=r"signs must have shape \(32,\)"):
        hadamard_transform(torch.zeros(2, 64), -1, 32, signs=torch.ones(16))


@pytest.mark.parametrize("axis", [2, -3])
def test_axis_out_of_range_raises(axis):
    with pytest.raises(ValueError, match="out of range"):
        hadamard_transform(torch.zeros(2, 32), axis, 16)


def test_a_rotation_is_the_size_and_signs_pair_with_names():
    from backends.quant import QuantSpec, Rotation, fake_quantize, quantize
    from backends.recipes import GemmRecipe, HadamardSpec

    s = sign_vector(32, 5)
    rot = Rotation(32, s)
    assert rot == (32, s) and (rot.size, rot.signs) == (32, s)
    x = torch.randn(8, 96, generator=G)
    for spec in (QuantSpec(format="mxfp4"), QuantSpec(format="nvfp4", rounding="sr")):
        named = fake_quantize(x, spec, key=3, hadamard=rot)
        assert torch.equal(named, fake_quantize(x, spec, key=3, hadamard=(32, s)))  # a plain pair
        assert torch.equal(quantize(x, spec, key=3, hadamard=rot).dequantize(), named)
    # a GEMM's rotation: its transform's size with the call's signs (None: dht), or none at all
    spec = QuantSpec(format="mxfp4")
    dht = GemmRecipe(a=spec, b=spec, hadamard=HadamardSpec(size=64))
    assert (
        dht.rotation(None) == Rotation(64, None) and GemmRecipe(a=spec, b=spec).rotation(s) is None
    )
