"""attnx.ops: forward parity with NumPy on plain arrays, and every op's gradient on the tape
against float64 central differences, over fuzzed shapes (broadcasting included); the tape's own
rules: a value used twice, weights found by identity, integer values without gradient."""
import numpy as np
import pytest

from attnx import ops

EPS = 1e-6


# ----------------------------------------------------------------------------- harness
def _numeric_grad(f, arrays, k, upstream):
    """d sum(f(*arrays) * upstream) / d arrays[k] by central differences (f on plain arrays)."""
    x = arrays[k]
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + EPS
        plus = np.sum(np.asarray(f(*arrays)) * upstream)
        flat[i] = old - EPS
        minus = np.sum(np.asarray(f(*arrays)) * upstream)
        flat[i] = old
        gflat[i] = (plus - minus) / (2 * EPS)
    return grad


def check(f, reference, *arrays, seed=0, rtol=1e-6, atol=1e-8):
    """f (with attnx.ops) equals `reference` (with NumPy) on plain arrays, and its tape gradient
    with respect to every float array equals central differences."""
    arrays = [np.array(a, dtype=np.float64) if np.asarray(a).dtype.kind == "f" else np.asarray(a) for a in arrays]
    plain = f(*arrays)
    assert isinstance(plain, (np.ndarray, np.generic)), f"plain arrays in, got {type(plain)} out"
    np.testing.assert_allclose(plain, reference(*arrays), rtol=1e-12, atol=1e-12)
    tape = ops.Tape()
    with tape:
        leaves = [tape.watch(a) if a.dtype.kind == "f" else a for a in arrays]
        out = f(*leaves)
    assert isinstance(out, ops.TracedArray)
    np.testing.assert_allclose(out.value, plain, rtol=1e-12, atol=1e-12)
    upstream = np.random.default_rng(seed).standard_normal(np.shape(plain))
    traced = [leaf for leaf in leaves if isinstance(leaf, ops.TracedArray)]
    grads = tape.backward([out], [upstream], traced)
    for k, g in zip([i for i, leaf in enumerate(leaves) if isinstance(leaf, ops.TracedArray)], grads):
        assert g.shape == arrays[k].shape and g.dtype == np.float64
        np.testing.assert_allclose(g, _numeric_grad(f, arrays, k, upstream), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {k}")


def _broadcast_pair(rng):
    """Two shapes that broadcast together: a common shape, then axes dropped or set to 1 in each."""
    full = tuple(int(n) for n in rng.integers(1, 4, rng.integers(1, 4)))
    def thin(shape):
        shape = [1 if rng.random() < 0.3 else n for n in shape]
        return tuple(shape[int(rng.integers(0, len(shape))):]) if rng.random() < 0.3 else tuple(shape)
    return thin(full), thin(full)


SEEDS = [0, 1, 2, 3]


# ----------------------------------------------------------------------------- elementwise
BINARY = {
    "add": (ops.add, np.add, lambda r, s: r.standard_normal(s)),
    "subtract": (ops.subtract, np.subtract, lambda r, s: r.standard_normal(s)),
    "multiply": (ops.multiply, np.multiply, lambda r, s: r.standard_normal(s)),
    "divide": (ops.divide, np.divide, lambda r, s: r.choice([-1, 1], s) * (0.5 + r.random(s))),
    "power": (ops.power, np.power, lambda r, s: 0.5 + r.random(s)),
    "maximum": (ops.maximum, np.maximum, lambda r, s: r.standard_normal(s)),
    "minimum": (ops.minimum, np.minimum, lambda r, s: r.standard_normal(s)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("seed", SEEDS)
def test_binary_ops_broadcast(name, seed):
    op, reference, sample = BINARY[name]
    rng = np.random.default_rng(seed)
    s1, s2 = _broadcast_pair(rng)
    check(op, reference, sample(rng, s1), sample(rng, s2), seed=seed)


OPERATORS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b,
    "**": lambda a, b: a ** b,
}


@pytest.mark.parametrize("symbol", sorted(OPERATORS))
@pytest.mark.parametrize("seed", SEEDS[:2])
def test_operators_on_either_side(symbol, seed):
    """``traced op array``, ``array op traced``, ``traced op scalar``: the reflected methods, the
    ndarray deferring to a TracedArray (__array_ufunc__ = None)."""
    op = OPERATORS[symbol]
    rng = np.random.default_rng(seed)
    s1, s2 = _broadcast_pair(rng)
    a, b = 0.5 + rng.random(s1), 0.5 + rng.random(s2)
    check(op, op, a, b)                                     # both traced
    check(lambda x: op(x, b), lambda x: op(x, b), a)        # traced, ndarray
    check(lambda y: op(a, y), lambda y: op(a, y), b)        # ndarray, traced
    check(lambda x: op(2.0, op(x, 3.0)), lambda x: op(2.0, op(x, 3.0)), a)


def test_unary_operators_and_matmul_operator():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 2))
    check(lambda x: -x, np.negative, a)
    check(lambda x: abs(x), np.abs, a)
    check(lambda x, y: x @ y, np.matmul, a, b)
    check(lambda y: a @ y, lambda y: a @ y, b)


UNARY = {
    "negative": (ops.negative, np.negative, lambda r, s: r.standard_normal(s)),
    "abs": (ops.abs, np.abs, lambda r, s: r.standard_normal(s)),
    "square": (ops.square, np.square, lambda r, s: r.standard_normal(s)),
    "sqrt": (ops.sqrt, np.sqrt, lambda r, s: 0.2 + r.random(s)),
    "exp": (ops.exp, np.exp, lambda r, s: r.standard_normal(s)),
    "log": (ops.log, np.log, lambda r, s: 0.2 + r.random(s)),
    "tanh": (ops.tanh, np.tanh, lambda r, s: r.standard_normal(s)),
    "sigmoid": (ops.sigmoid, lambda x: 1 / (1 + np.exp(-x)), lambda r, s: 3 * r.standard_normal(s)),
    "relu": (ops.relu, lambda x: np.maximum(x, 0), lambda r, s: r.standard_normal(s)),
    "clip": (lambda x: ops.clip(x, -0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7), lambda r, s: r.standard_normal(s)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("seed", SEEDS)
def test_unary_ops(name, seed):
    op, reference, sample = UNARY[name]
    rng = np.random.default_rng(seed)
    check(op, reference, sample(rng, tuple(rng.integers(1, 5, rng.integers(0, 4)))), seed=seed)


def test_sigmoid_does_not_overflow():
    x = np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0])
    with np.errstate(over="raise"):
        y = ops.sigmoid(x)
    np.testing.assert_allclose(y, [0, 1 / (1 + np.exp(30)), 0.5, 1 / (1 + np.exp(-30)), 1], rtol=1e-12)


def test_where_differentiates_both_branches_not_the_condition():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    cond = rng.random((3, 4)) > 0.5
    check(lambda x, y: ops.where(cond, x, y), lambda x, y: np.where(cond, x, y), a, b)
    tape = ops.Tape()
    with tape:
        x = tape.watch(a)
        out = ops.where(x > 0, x, 0.0)  # a comparison of a traced value is a plain bool array
    assert isinstance(x > 0, np.ndarray)
    np.testing.assert_allclose(tape.backward([out], [np.ones_like(a)], [x])[0], (a > 0) * 1.0)


# ----------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("seed", SEEDS)
def test_softmax_over_any_axis(seed):
    rng = np.random.default_rng(seed)
    x = 3 * rng.standard_normal(tuple(rng.integers(1, 5, 3)))
    axis = int(rng.integers(-3, 3))

    def reference(v):
        e = np.exp(v - v.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)
    check(lambda v: ops.softmax(v, axis=axis), reference, x, seed=seed)


def test_softmax_with_mask_gives_zero_to_masked_entries_and_to_a_fully_masked_row():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5))
    mask = rng.random((3, 5)) > 0.4
    mask[0, 0], mask[2] = True, False

    def reference(v):
        out = np.zeros_like(v)
        for row, keep in zip(range(len(v)), mask):
            if keep.any():
                e = np.exp(v[row, keep] - v[row, keep].max())
                out[row, keep] = e / e.sum()
        return out
    x[1, ~mask[1]] = 1000.0  # masked entries never reach exp
    check(lambda v: ops.softmax(v, mask=mask), reference, x)
    assert not ops.softmax(x, mask=mask)[2].any()
    # a mask broadcast along the batch axis, as (1, S)
    check(lambda v: ops.softmax(v, mask=mask[:1]), lambda v: ops.softmax(v, mask=np.broadcast_to(mask[:1], v.shape)), x)


# ----------------------------------------------------------------------------- products
@pytest.mark.parametrize("shapes", [((3, 4), (4, 2)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)),
                                    ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2)), ((1, 3, 4), (2, 4, 2))])
def test_matmul_broadcasts_batch_axes_and_vectors(shapes):
    rng = np.random.default_rng(len(shapes[0]))
    check(ops.matmul, np.matmul, *(rng.standard_normal(s) for s in shapes))


@pytest.mark.parametrize("shapes", [((2, 3, 4), (4, 1)), ((3, 4), (4, 2)), ((3, 4), (4,)), ((4,), (4, 3)),
                                    ((2, 3, 4), (5, 4, 2)), ((4,), (4,)), ((), (3, 2)), ((2, 3), ())])
def test_dot_has_numpy_semantics(shapes):
    rng = np.random.default_rng(sum(len(s) for s in shapes))
    check(ops.dot, np.dot, *(rng.standard_normal(s) for s in shapes))


EINSUMS = {
    "btc,cd->btd": [(2, 3, 4), (4, 5)],      # a projection
    "bqd,bkd->bqk": [(2, 3, 4), (2, 5, 4)],  # attention scores
    "bqk,bkd->bqd": [(2, 3, 5), (2, 5, 4)],  # attention context
    "bt,btc->bc": [(2, 3), (2, 3, 4)],       # pooling
    "ij,jk": [(3, 4), (4, 2)],               # implicit output
    "ij->i": [(3, 4)],                       # a sum
    "ij->ji": [(3, 4)],
    "bij,bjk->bik": [(2, 3, 4), (2, 4, 5)],
    "ij,k->ijk": [(2, 3), (4,)],             # an outer product
    "ijk,j->i": [(2, 3, 4), (3,)],           # k summed away from one operand before the product
    "ab,bc,cd->ad": [(2, 3), (3, 4), (4, 2)],
}


@pytest.mark.parametrize("subscripts", sorted(EINSUMS))
def test_einsum(subscripts):
    rng = np.random.default_rng(len(subscripts))
    arrays = [rng.standard_normal(s) for s in EINSUMS[subscripts]]
    check(lambda *xs: ops.einsum(subscripts, *xs), lambda *xs: np.einsum(subscripts, *xs), *arrays)


def test_einsum_refuses_what_it_cannot_differentiate():
    with pytest.raises(ValueError, match="'...' is not supported"):
        ops.einsum("...i,i->...", np.ones((2, 3)), np.ones(3))
    tape = ops.Tape()
    with tape:
        x = tape.watch(np.ones((3, 3)))
        out = ops.einsum("ii->i", x)
    with pytest.raises(ValueError, match="repeated"):
        tape.backward([out], [np.ones(3)], [x])


# ----------------------------------------------------------------------------- reductions
REDUCTIONS = {"sum": (ops.sum, np.sum), "mean": (ops.mean, np.mean), "max": (ops.max, np.max)}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(name, axis, keepdims):
    op, reference = REDUCTIONS[name]
    x = np.random.default_rng(hash((name, str(axis), keepdims)) % 1000).standard_normal((3, 2, 4))
    check(lambda v: op(v, axis=axis, keepdims=keepdims), lambda v: reference(v, axis=axis, keepdims=keepdims), x)


def test_max_shares_the_gradient_between_ties():
    tape = ops.Tape()
    with tape:
        x = tape.watch(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]]))
        out = ops.max(x, axis=1)
    np.testing.assert_allclose(tape.backward([out], [np.ones(2)], [x])[0], [[0, 0.5, 0.5], [1, 0, 0]])


# ----------------------------------------------------------------------------- shapes
SHAPE_OPS = {
    "expand_dims": (lambda x: ops.expand_dims(x, 1), lambda x: np.expand_dims(x, 1)),
    "expand_dims_last": (lambda x: ops.expand_dims(x, -1), lambda x: np.expand_dims(x, -1)),
    "squeeze": (lambda x: ops.squeeze(x[:, :1], axis=1), lambda x: np.squeeze(x[:, :1], axis=1)),
    "reshape": (lambda x: ops.reshape(x, (-1, 2)), lambda x: np.reshape(x, (-1, 2))),
    "transpose": (ops.transpose, np.transpose),
    "transpose_axes": (lambda x: ops.transpose(x, (1, 2, 0)), lambda x: np.transpose(x, (1, 2, 0))),
    "T": (lambda x: x.T if isinstance(x, ops.TracedArray) else ops.transpose(x), np.transpose),
    "getitem_basic": (lambda x: x[:, -1], lambda x: x[:, -1]),
    "getitem_fancy": (lambda x: x[[0, 0, 1]], lambda x: x[[0, 0, 1]]),
    "getitem_bool": (lambda x: x[np.array([True, False])], lambda x: x[np.array([True, False])]),
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_ops(name):
    op, reference = SHAPE_OPS[name]
    check(op, reference, np.random.default_rng(0).standard_normal((2, 3, 4)))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate_and_stack(axis):
    rng = np.random.default_rng(axis + 1)
    shape = [2, 3, 4]
    a = rng.standard_normal(shape)
    shape[axis] = 1
    b = rng.standard_normal(shape)
    check(lambda x, y: ops.concatenate([x, y, x], axis=axis), lambda x, y: np.concatenate([x, y, x], axis=axis), a, b)
    c = rng.standard_normal((2, 3, 4))
    check(lambda x, y: ops.stack([x, y], axis=axis), lambda x, y: np.stack([x, y], axis=axis), a, c)


# ----------------------------------------------------------------------------- attention kernels
def _sdpa_reference(q, k, v, mask=None, causal=False, heads=1):
    B, Tq, _ = q.shape
    S = k.shape[1]
    dk, dv = q.shape[-1] // heads, v.shape[-1] // heads
    out = []
    for h in range(heads):
        scores = q[..., h * dk:(h + 1) * dk] @ np.swapaxes(k[..., h * dk:(h + 1) * dk], 1, 2) / np.sqrt(dk)
        allowed = np.ones((B, Tq, S), bool)
        if mask is not None:
            allowed &= mask[:, None, :] if mask.ndim == 2 else mask
        if causal:
            allowed &= np.tril(np.ones((Tq, S), bool))
        out.append(ops.softmax(scores, mask=allowed) @ v[..., h * dv:(h + 1) * dv])
    return np.concatenate(out, axis=-1)


@pytest.mark.parametrize("heads,causal,masked", [(1, False, False), (2, False, True), (1, True, False),
                                                 (2, True, True)])
def test_scaled_dot_product_attention(heads, causal, masked):
    rng = np.random.default_rng(heads + 2 * causal + 4 * masked)
    B, Tq, S = 2, 3, 3 if causal else 4
    q, k, v = (rng.standard_normal((B, T, 2 * heads)) for T in (Tq, S, S))
    mask = None
    if masked:
        mask = rng.random((B, S)) > 0.3
        mask[:, 0] = True
    check(lambda *a: ops.scaled_dot_product_attention(*a, mask=mask, causal=causal, heads=heads),
          lambda *a: _sdpa_reference(*a, mask=mask, causal=causal, heads=heads), q, k, v, rtol=1e-6, atol=1e-9)


def test_attention_pooling():
    rng = np.random.default_rng(0)
    x, kernel, bias = rng.standard_normal((2, 5, 3)), rng.standard_normal((3, 1)), rng.standard_normal((5, 1))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)

    def reference(x, kernel, bias):
        weights = ops.softmax(np.tanh(x @ kernel + bias)[..., 0], mask=mask)
        return np.sum(x * weights[..., None], axis=1)
    check(lambda *a: ops.attention_pooling(*a, mask=mask), reference, x, kernel, bias)


# ----------------------------------------------------------------------------- the tape
def test_a_value_used_twice_gets_the_sum_of_its_gradients():
    x = np.random.default_rng(0).standard_normal((3, 4))
    check(lambda v: v * v + ops.tanh(v) * v - v, lambda v: v * v + np.tanh(v) * v - v, x)


def test_watched_arrays_are_found_by_identity_and_gradients_added_into_their_buffer():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3)), rng.standard_normal((3, 2))
    dw = np.ones_like(w)
    tape = ops.Tape()
    with tape:
        tx = tape.watch(x)
        tape.watch(w, into=dw)
        out = ops.dot(tx, w) + ops.sum(w)  # the raw array, twice
        assert tape.watch(w) is tape.traced(w)  # one leaf per array
        assert tape.traced(w.copy()) is not tape.traced(w)  # an equal array is a constant
    dy = rng.standard_normal((2, 2))
    dx, = tape.backward([out], [dy], [tx])
    np.testing.assert_allclose(dx, dy @ w.T)
    np.testing.assert_allclose(dw, 1 + x.T @ dy + dy.sum())


def test_integer_and_constant_values_are_not_traced():
    ids = np.array([[0, 2], [1, 1]])
    with ops.Tape():
        out = ops.add(ids, 1)
        assert isinstance(out, np.ndarray)  # nothing traced: plain result
    tape = ops.Tape()
    with tape:
        x = tape.watch(np.ones((2, 2)))
        out = x * ids
    assert isinstance(out, ops.TracedArray)
    np.testing.assert_allclose(tape.backward([out], [np.ones((2, 2))], [x])[0], ids)


def test_unused_source_gets_zeros_and_float32_stays_float32():
    tape = ops.Tape()
    with tape:
        x = tape.watch(np.ones((2, 3), np.float32))
        unused = tape.watch(np.ones(4, np.float32))
        out = ops.sum(x * 2.0, axis=0)
    dx, dunused = tape.backward([out], [np.ones(3)], [x, unused])
    assert dx.dtype == np.float32 and isinstance(out.value, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(dunused, np.zeros(4, np.float32))


def test_traced_values_refuse_numpy_and_other_calls():
    tape = ops.Tape()
    with tape:
        x = tape.watch(np.ones(3))
        with pytest.raises(TypeError, match="attnx.ops"):
            np.asarray(x)
    outside = ops.tanh(x)  # after its tape, a traced value is its array (a loss read after the `with` block)
    assert type(outside) is np.ndarray and np.allclose(outside, np.tanh(1.0))
    with ops.Tape():
        with pytest.raises(ValueError, match="another training call"):
            ops.tanh(x)


def test_plain_arrays_give_plain_arrays_at_full_speed():
    """Outside a tape the ops are NumPy's (the heavy ones BLAS): no TracedArray, dtype kept."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 50, 64)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
    y = ops.dot(x, w)
    assert type(y) is np.ndarray and y.dtype == np.float32
    np.testing.assert_allclose(y, np.dot(x, w), rtol=1e-5, atol=1e-5)
    assert ops.active_tape() is None
