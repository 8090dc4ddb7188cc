"""attnx.ops validates as NumPy does and differentiates every axis argument (issue 31): negative and
permuted axes give the right gradient (float64 central differences), einsum accepts and refuses the
shapes NumPy accepts and refuses, and wrong arguments of the attention ops are clear errors."""
import numpy as np
import pytest

from attnx import _core, ops
from test_ops import check

AXIS_OPS = {
    "transpose(-1, 0)": (lambda x: ops.transpose(x, (-1, 0)), lambda x: np.transpose(x, (-1, 0)), (2, 3)),
    "transpose(-1, -3, 1)": (lambda x: ops.transpose(x, (-1, -3, 1)), lambda x: np.transpose(x, (-1, -3, 1)),
                             (2, 3, 4)),
    "transpose(2, 0, 1)": (lambda x: ops.transpose(x, [2, 0, 1]), lambda x: np.transpose(x, [2, 0, 1]), (2, 3, 4)),
    "sum(-1, -3)": (lambda x: ops.sum(x, axis=(-1, -3)), lambda x: np.sum(x, axis=(-1, -3)), (2, 3, 4)),
    "mean(-2, keepdims)": (lambda x: ops.mean(x, axis=-2, keepdims=True),
                           lambda x: np.mean(x, axis=-2, keepdims=True), (2, 3, 4)),
    "max(2, 0)": (lambda x: ops.max(x, axis=(2, 0)), lambda x: np.max(x, axis=(2, 0)), (2, 3, 4)),
    "softmax(-2)": (lambda x: ops.softmax(x, axis=-2),
                    lambda x: np.exp(x) / np.exp(x).sum(axis=-2, keepdims=True), (2, 3, 4)),
    "expand_dims(-2)": (lambda x: ops.expand_dims(x, -2), lambda x: np.expand_dims(x, -2), (2, 3)),
    "squeeze(-2)": (lambda x: ops.squeeze(ops.expand_dims(x, -2), axis=-2), lambda x: x, (2, 3)),
    "concatenate(-2)": (lambda x: ops.concatenate([x, x[:, :1]], axis=-2),
                        lambda x: np.concatenate([x, x[:, :1]], axis=-2), (2, 3, 4)),
    "stack(-1)": (lambda x: ops.stack([x, 2 * x], axis=-1), lambda x: np.stack([x, 2 * x], axis=-1), (2, 3)),
    "stack(-3)": (lambda x: ops.stack([x, 2 * x], axis=-3), lambda x: np.stack([x, 2 * x], axis=-3), (2, 3)),
}


@pytest.mark.parametrize("name", sorted(AXIS_OPS))
def test_negative_and_permuted_axes_have_the_right_gradient(name):
    op, reference, shape = AXIS_OPS[name]
    check(op, reference, np.random.default_rng(len(name)).standard_normal(shape))


def test_transpose_with_negative_axes_gives_the_transposed_gradient():
    tape = ops.Tape()
    with tape:
        x = tape.watch(np.zeros((2, 3)))
        out = ops.transpose(x, (-1, 0))
    dy = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(tape.backward([out], [dy], [x])[0], dy.T)


# NumPy refuses each of these: so must attnx, with a ValueError (TypeError for a non-string)
REFUSED = [
    ("ijk,jkl->il", [(2, 2, 3), (3, 2, 4)]),
    ("ij,jk->ik", [(2, 3), (4, 5)]),
    ("ij,ij->ij", [(2, 3), (3, 3)]),
    ("bij,bjk->bik", [(2, 3, 4), (3, 4, 5)]),
    ("ij,jk->iz", [(2, 2), (2, 2)]),
    ("ij,jk->ii", [(2, 2), (2, 2)]),
    ("i1,jk", [(2, 2), (2, 2)]),
    ("ij,jk->ik->x", [(2, 2), (2, 2)]),
    ("ij", [(2,)]),
    ("ij,jk", [(2, 2)]),
]


@pytest.mark.parametrize("subscripts, shapes", REFUSED)
def test_einsum_refuses_what_numpy_refuses(subscripts, shapes):
    arrays = [np.ones(s) for s in shapes]
    with pytest.raises(ValueError):
        np.einsum(subscripts, *arrays)
    with pytest.raises(ValueError, match="einsum: "):
        ops.einsum(subscripts, *arrays)
    tape = ops.Tape()
    with tape, pytest.raises(ValueError, match="einsum: "):
        ops.einsum(subscripts, *[tape.watch(a) for a in arrays])


def test_einsum_size_mismatch_names_the_axis():
    with pytest.raises(ValueError, match=r"'ijk,jkl->il': axis 'j' has size 2 in operand 0 and 3 in operand 1"):
        ops.einsum("ijk,jkl->il", np.ones((2, 2, 3)), np.ones((3, 2, 4)))


# NumPy broadcasts an axis of size 1 in einsum: so does attnx, with the gradient summed back
BROADCAST = [
    ("ij,ij->ij", [(1, 3), (2, 3)]),
    ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]),
    ("ij,jk->ik", [(2, 1), (3, 4)]),
    ("ijk,j->i", [(2, 1, 4), (3,)]),
]


@pytest.mark.parametrize("subscripts, shapes", BROADCAST)
def test_einsum_broadcasts_size_one_axes_as_numpy(subscripts, shapes):
    rng = np.random.default_rng(len(subscripts))
    arrays = [rng.standard_normal(s) for s in shapes]
    check(lambda *xs: ops.einsum(subscripts, *xs), lambda *xs: np.einsum(subscripts, *xs), *arrays)


@pytest.mark.parametrize("subscripts", [None, 3, b"ij->ji"])
def test_einsum_subscripts_must_be_a_string(subscripts):
    with pytest.raises(TypeError, match="einsum: subscripts must be a string"):
        ops.einsum(subscripts, np.ones((2, 2)))


@pytest.mark.parametrize("heads", [1.7, 0, -2, True, "2", None, 2.0])
def test_attention_heads_must_be_a_positive_integer(heads):
    q = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: `heads` must be a positive integer"):
        ops.scaled_dot_product_attention(q, q, q, heads=heads)


def test_attention_heads_as_numpy_integer_run():
    q = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(ops.scaled_dot_product_attention(q, q, q, heads=np.int64(2)),
                                  ops.scaled_dot_product_attention(q, q, q, heads=2))


def test_attention_ops_refuse_complex_inputs():
    q = np.ones((2, 3, 4), np.complex64)
    real = np.ones((2, 3, 4), np.float32)
    with pytest.raises(TypeError, match=r"scaled_dot_product_attention: `key` must hold real numbers, got dtype "
                                        r"complex64"):
        ops.scaled_dot_product_attention(real, q, real)
    with pytest.raises(TypeError, match=r"attention_pooling: `x` must hold real numbers"):
        ops.attention_pooling(q, np.ones((4, 1)), np.ones((3, 1)))
    with pytest.raises(TypeError, match=r"attention_pooling: `bias` must hold real numbers"):
        ops.attention_pooling(real, np.ones((4, 1)), np.array([["x"]] * 3))


def test_attention_pooling_backward_binding_checks_the_bias_gradient_shape():
    rng = np.random.default_rng(0)
    B, T, C = 2, 5, 3
    x, kernel = rng.standard_normal((B, T, C)).astype(np.float32), rng.standard_normal((C, 1)).astype(np.float32)
    bias = np.zeros((T, 1), np.float32)
    out, weights, energy = _core.attention_pooling_forward(x=x, kernel=kernel, bias=bias)
    args = dict(dout=np.ones((B, C), np.float32), dweights=None, weights=weights, energy=energy, x=x,
                kernel=kernel, dkernel=np.zeros((C, 1), np.float32))
    dbias = np.zeros((T, 1), np.float32)
    _core.attention_pooling_backward(**args, dbias=dbias)
    assert np.count_nonzero(dbias) > 1
    for shape in [(1, T), (T,), (T, 2), (1, 1, T)]:
        with pytest.raises(ValueError, match=r"attention_pooling_backward: dbias expected shape \(5, 1\) or "
                                             r"\(1, 1\), got"):
            _core.attention_pooling_backward(**args, dbias=np.zeros(shape, np.float32))
