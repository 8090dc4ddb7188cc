"""`mixed_bfloat16` (attnx.mixed_precision): the policy API as Keras', the bf16 kernels against NumPy and
PyTorch's rounding, and a contract over every public layer: under the policy its weights are float32, its
config records the policy, and its outputs and gradients are float32's within bfloat16's tolerance where
it runs bf16 products (`compute_dtype == "bfloat16"` somewhere in it), or float32's exactly where it falls
back to float32 (documented in docs/guides/mixed_precision.md)."""
import numpy as np
import pytest

import attnx
from attnx import _core, kernels, layers, mixed_precision

from test_layer_contract import CASES, TRAINING_EXEMPT, _run, _symbolic_call

BF16_TOLERANCE = 2e-2  # relative to the norm of the float32 result: bf16 keeps 8 significant bits


@pytest.fixture(autouse=True)
def _reset_policy():
    yield
    mixed_precision.set_global_policy(None)


def _bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), independently of attnx: through float64."""
    x = np.asarray(x, np.float64)
    m, e = np.frexp(x)
    quantum_exp = np.maximum(e, -125) - 8
    return np.ldexp(np.rint(np.ldexp(x, -quantum_exp)), quantum_exp)


# ----------------------------------------------------------------------------- the policy API
def test_policy_names_and_dtypes():
    p = mixed_precision.Policy("mixed_bfloat16")
    assert (p.name, p.variable_dtype, p.compute_dtype) == ("mixed_bfloat16", "float32", "bfloat16")
    assert mixed_precision.Policy("float64").compute_dtype == "float64"
    assert mixed_precision.Policy(p) == p and mixed_precision.DTypePolicy is mixed_precision.Policy
    assert mixed_precision.Policy.from_config(p.get_config()) == p


@pytest.mark.parametrize("name", ["float16", "mixed_float16", "bfloat16", "int8", 3])
def test_unknown_policies_are_refused(name):
    with pytest.raises(ValueError, match="Policy: expected one of float32, float64, mixed_bfloat16"):
        mixed_precision.Policy(name)
    with pytest.raises(ValueError, match="Policy"):
        mixed_precision.set_global_policy(name)


def test_a_layer_dtype_that_is_no_policy_is_a_type_error():
    with pytest.raises(TypeError, match="Dense dtype: attnx computes in float32 or float64"):
        layers.Dense(2, dtype="float16")


def test_global_policy_applies_to_layers_made_after_it():
    assert mixed_precision.global_policy().name == attnx.backend.floatx()
    mixed_precision.set_global_policy("mixed_bfloat16")
    dense, lstm, embedding = layers.Dense(3), layers.LSTM(4), layers.Embedding(5, 2)
    for layer in (dense, lstm, embedding):
        assert layer.dtype_policy.name == "mixed_bfloat16" and layer.dtype == np.float32
    assert (dense.compute_dtype, lstm.compute_dtype, embedding.compute_dtype) == ("bfloat16", "bfloat16", "float32")
    assert layers.Dense(3, dtype="float32").compute_dtype == "float32"
    mixed_precision.set_global_policy(None)
    assert layers.Dense(3).dtype_policy.name == "float32"


def test_bf16_layers_are_the_ones_documented():
    """The guide's list of layers with bf16 products is the code's (a layer added to either fails here)."""
    import pathlib
    guide = (pathlib.Path(__file__).parents[1] / "docs" / "guides" / "mixed_precision.md").read_text()
    listed = guide.split("<!-- bf16 layers -->")[1].split("<!-- /bf16 layers -->")[0]
    documented = {w.strip("`, .\n") for w in listed.split() if w.startswith("`")}
    public = {name: getattr(layers, name) for name in layers.__all__ if name != "Layer"}
    assert documented == {name for name, cls in public.items() if cls._bf16_products}


# ----------------------------------------------------------------------------- the kernels
def test_round_to_bfloat16_is_round_to_nearest_even():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32)
    ties = (np.array([0x3F80, 0x3F81, 0x4049], np.uint32)[:, None] << 16 | np.array([0x8000, 0x7FFF, 0x8001],
                                                                                      np.uint32)).ravel()
    x = np.concatenate([bits, ties]).view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) < 3.3e38)]  # the overflow to inf: the C++ test
    got = kernels.round_to_bfloat16(x=x)
    np.testing.assert_array_equal(got.astype(np.float64), _bf16(x))


def test_round_to_bfloat16_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000)).astype(np.float32)
    x = np.concatenate([x, [np.inf, -np.inf, np.nan, 0.0, -0.0, 1.00390625, 1.01171875]]).astype(np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(kernels.round_to_bfloat16(x=x), want)


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_bf16_matmul_is_the_product_of_rounded_operands(transpose_a, transpose_b):
    rng = np.random.default_rng(2)
    M, N, K = 37, 70, 301
    a = rng.standard_normal((K, M) if transpose_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if transpose_b else (K, N)).astype(np.float32)
    op_a, op_b = (_bf16(a).T if transpose_a else _bf16(a)), (_bf16(b).T if transpose_b else _bf16(b))
    want = op_a @ op_b
    got = kernels.bf16_matmul(a=a, b=b, transpose_a=transpose_a, transpose_b=transpose_b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    out = np.ones((M, N), np.float32)
    assert kernels.bf16_matmul(a=a, b=b, transpose_a=transpose_a, transpose_b=transpose_b, out=out) is out
    np.testing.assert_allclose(out, want + 1, rtol=1e-5, atol=1e-4)
    # the float32 product is further from it than the tolerance: the rounding is there
    exact = (a.T if transpose_a else a).astype(np.float64) @ (b.T if transpose_b else b)
    assert np.abs(exact - want).max() > 1e-2


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def test_lstm_steps_multiply_the_state_in_bf16(level):
    """One LSTM step (and its dh0) under bf16=True is the float64 equations on bf16-rounded x, W, h0, U and
    dgates: the time loop's h.U and dgates.U^T are bf16 products too, at every SIMD level. (One step: over
    many, float32 and float64 states round to other bf16 values now and then; the C++ reference test
    checks the steps one at a time.)"""
    rng = np.random.default_rng(11)
    B, C, H = 5, 6, 20
    x, h0, c0 = (rng.standard_normal(s).astype(np.float32) for s in [(B, 1, C), (B, H), (B, H)])
    W = (rng.standard_normal((C, 4 * H)) * 0.4).astype(np.float32)
    U = (rng.standard_normal((H, 4 * H)) * 0.3).astype(np.float32)
    dy = rng.standard_normal((B, 1, H)).astype(np.float32)
    y, h, c, cache = kernels.rnn_forward(cell="lstm", x=x, kernel=W, recurrent_kernel=U, bias=None,
                                         recurrent_bias=None, h0=h0, c0=c0, mask=None, recurrent_mask=None, bf16=True)
    dW, dU = np.zeros_like(W), np.zeros_like(U)
    _, dh0, _ = kernels.rnn_backward(cell="lstm", x=x, kernel=W, recurrent_kernel=U, cache=cache, mask=None,
                                     recurrent_mask=None, dy=dy, dh=None, dc=None, dkernel=dW, drecurrent_kernel=dU,
                                     dbias=None, drecurrent_bias=None, bf16=True)

    def step(round_state):
        hr = _bf16(h0) if round_state else h0.astype(np.float64)
        Ur = _bf16(U) if round_state else U.astype(np.float64)
        pre = _bf16(x[:, 0]) @ _bf16(W) + hr @ Ur
        i, f, o = _sigmoid(pre[:, :H]), _sigmoid(pre[:, H:2 * H]), _sigmoid(pre[:, 3 * H:])
        g = np.tanh(pre[:, 2 * H:3 * H])
        c_t = f * c0 + i * g
        y_t = o * np.tanh(c_t)
        # dh0 = bf16(dgates) . bf16(U)^T
        do = dy[:, 0] * np.tanh(c_t) * o * (1 - o)
        dc = dy[:, 0] * o * (1 - np.tanh(c_t) ** 2)
        dgates = np.concatenate([dc * g * i * (1 - i), dc * c0 * f * (1 - f), dc * i * (1 - g * g), do], axis=1)
        dh = (_bf16(dgates) @ _bf16(U).T) if round_state else dgates @ U.astype(np.float64).T
        return y_t, dh

    want_y, want_dh = step(True)
    np.testing.assert_allclose(y[:, 0], want_y, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(dh0, want_dh, rtol=1e-4, atol=1e-5)
    float_y, _ = step(False)
    assert np.abs(float_y - want_y).max() > 1e-4  # h0.U in float32 would be told apart


def test_bf16_kernels_refuse_bad_operands():
    a = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="bf16_matmul: the inner sizes differ"):
        kernels.bf16_matmul(a=a, b=np.ones((5, 2), np.float32))
    with pytest.raises(TypeError, match="bf16_matmul: a: expected dtype float32"):
        kernels.bf16_matmul(a=a.astype(np.float64), b=np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match="bf16_matmul: out: expected shape"):
        kernels.bf16_matmul(a=a, b=np.ones((4, 2), np.float32), out=np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="bf16_matmul: b: expected rank 2"):
        kernels.bf16_matmul(a=a, b=np.ones(4, np.float32))
    image, kernel = np.ones((1, 4, 4, 2)), np.ones((3, 3, 2, 5))
    with pytest.raises(TypeError, match="conv2d_forward: bf16 needs float32 operands"):
        kernels.conv2d_forward(x=image, kernel=kernel, bias=None, strides=(1, 1), bf16=True)
    with pytest.raises(TypeError, match="conv2d_backward: bf16 needs float32 operands"):
        kernels.conv2d_backward(dy=np.ones((1, 2, 2, 5)), x=image, kernel=kernel, y=np.ones((1, 2, 2, 5)),
                                z=np.ones((1, 2, 2, 5)), strides=(1, 1), padding="valid", activation="linear",
                                dkernel=np.zeros_like(kernel), dbias=None, bf16=True)
    x = np.ones((2, 3, 4))
    with pytest.raises(TypeError, match="rnn_forward: bf16 needs float32 operands"):
        kernels.rnn_forward(cell="lstm", x=x, kernel=np.ones((4, 8)), recurrent_kernel=np.ones((2, 8)), bias=None,
                            recurrent_bias=None, h0=None, c0=None, mask=None, recurrent_mask=None, bf16=True)


def test_dense_matches_torch_on_rounded_operands():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    layer = layers.Dense(40, activation="relu", dtype="mixed_bfloat16")
    x = rng.standard_normal((9, 5, 33)).astype(np.float32)
    y = layer(x)
    k, b = (torch.from_numpy(w) for w in layer.get_weights())
    want = torch.relu(torch.from_numpy(x).bfloat16().float() @ k.bfloat16().float() + b).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [lambda dtype: layers.Conv2D(5, 3, strides=2, padding="same", dtype=dtype),
                                  lambda dtype: layers.Conv2D(4, (2, 3), dtype=dtype),
                                  lambda dtype: layers.Conv1D(6, 3, dilation_rate=2, padding="causal", dtype=dtype),
                                  lambda dtype: layers.Conv1D(4, 3, groups=2, dtype=dtype)],
                         ids=["Conv2D same stride 2", "Conv2D 2x3", "Conv1D dilated causal", "Conv1D groups"])
def test_convolutions_multiply_rounded_operands(make):
    """Conv1D / Conv2D under mixed_bfloat16: the output, dx and dkernel are float64's convolution of the
    bf16-rounded input, kernel and dy (the bias added unrounded), within float32's sums."""
    rng = np.random.default_rng(14)
    mixed, exact = make("mixed_bfloat16"), make("float64")
    assert mixed.compute_dtype == "bfloat16"
    x = rng.standard_normal((3, 9, 8, 4) if isinstance(mixed, layers.Conv2D) else (3, 11, 4)).astype(np.float32)
    y = mixed(x, training=True)
    exact(x.astype(np.float64))  # builds
    kernel, bias = mixed.get_weights()
    bias += rng.standard_normal(bias.shape).astype(np.float32)
    mixed.set_weights([kernel, bias])
    exact.set_weights([_bf16(kernel), bias.astype(np.float64)])
    y = mixed(x, training=True)
    np.testing.assert_allclose(y, exact(_bf16(x), training=True), rtol=1e-5, atol=1e-5)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_allclose(mixed.backward(dy), exact.backward(_bf16(dy)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mixed.grads["kernel"], exact.grads["kernel"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(mixed.grads["bias"], dy.reshape(-1, dy.shape[-1]).sum(axis=0), rtol=1e-5, atol=1e-5)
    single = make("float32")  # float32 products would be told apart
    single(x)
    single.set_weights([kernel, bias])
    assert np.abs(single(x) - y).max() > 1e-3


def test_attention_scores_and_context_multiply_rounded_operands():
    """scaled_dot_product_attention with bf16 (MultiHeadAttention's under the policy): the scores are float64's
    products of the bf16-rounded query and key, the context of the rounded weights * keep and value, and the
    backward's four products likewise (its softmax backward in float32), within float32's sums."""
    from attnx.layers.attention import scaled_dot_product_attention, scaled_dot_product_attention_backward
    rng = np.random.default_rng(21)
    B, T, S, H, dk, dv = 2, 5, 67, 2, 8, 6
    q, k = rng.standard_normal((B, T, H * dk)).astype(np.float32), rng.standard_normal((B, S, H * dk)).astype(np.float32)
    v = rng.standard_normal((B, S, H * dv)).astype(np.float32)
    keep = (rng.random((B, H, T, S)) < 0.5).astype(np.float32) * 2  # rate 0.5: weights * keep exact in float32
    dcontext = rng.standard_normal((B, T, H * dv)).astype(np.float32)
    scale = 1 / np.sqrt(dk)
    context, weights = scaled_dot_product_attention(q, k, v, heads=H, dropout_keep=keep, bf16=True)
    heads = lambda a, d: _bf16(a).reshape(a.shape[0], a.shape[1], H, d).transpose(0, 2, 1, 3)  # (B, H, T, d)
    scores = scale * heads(q, dk) @ heads(k, dk).transpose(0, 1, 3, 2)
    want_weights = np.exp(scores - scores.max(-1, keepdims=True))
    want_weights /= want_weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
    used = _bf16(weights * keep)  # from the kernel's own float32 weights, rounded as it rounds them
    want_context = (used @ heads(v, dv)).transpose(0, 2, 1, 3).reshape(B, T, H * dv)
    np.testing.assert_allclose(context, want_context, rtol=1e-5, atol=1e-5)
    float32_context, _ = scaled_dot_product_attention(q, k, v, heads=H, dropout_keep=keep)
    assert np.abs(float32_context - context).max() > 1e-3  # the rounding is there
    dq, dk_, dv_ = scaled_dot_product_attention_backward(dcontext, weights, q, k, v, heads=H, dropout_keep=keep,
                                                          bf16=True)
    dc = heads(dcontext, dv)
    np.testing.assert_allclose(dv_, (used.transpose(0, 1, 3, 2) @ dc).transpose(0, 2, 1, 3).reshape(v.shape),
                               rtol=1e-5, atol=1e-5)
    dp = (dc @ heads(v, dv).transpose(0, 1, 3, 2)) * keep
    dscores = weights * (dp - (dp * weights).sum(-1, keepdims=True))
    # dscores rounds to bf16 in float32 here and in float64 there: one bf16 step apart where near a tie
    step = np.abs(dscores).max() / 128 * scale
    np.testing.assert_allclose(dq, (scale * _bf16(dscores) @ heads(k, dk)).transpose(0, 2, 1, 3).reshape(q.shape),
                               rtol=1e-5, atol=1e-5 + step * np.abs(k).max())
    np.testing.assert_allclose(dk_, (scale * _bf16(dscores).transpose(0, 1, 3, 2) @ heads(q, dk)).transpose(0, 2, 1, 3)
                               .reshape(k.shape), rtol=1e-5, atol=1e-5 + step * np.abs(q).max())
    with pytest.raises(TypeError, match="sdpa_forward: bf16 needs float32 operands, got float64"):
        scaled_dot_product_attention(q.astype(np.float64), k, v, heads=H, bf16=True)
    with pytest.raises(TypeError, match="sdpa_backward: bf16 needs float32 operands, got float64"):
        scaled_dot_product_attention_backward(dcontext, weights, q.astype(np.float64), k, v, heads=H, bf16=True)


@pytest.mark.parametrize("level", ["baseline", "avx2", "avx512"])
def test_every_simd_level_gives_the_same_dense_training_step(level):
    """The float-lane levels agree bit for bit (the C++ test proves it on every shape); vdpbf16ps and AMX
    tiles, where they run, within float32 rounding of them."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((50, 70)).astype(np.float32)
    dy = rng.standard_normal((50, 30)).astype(np.float32)

    def step(level, dot_instruction, amx):
        _core._force_simd_level(level)
        _core._bf16_allow_dot_instruction(dot_instruction)
        _core._amx_allow(amx)
        try:
            attnx.set_random_seed(0)
            layer = layers.Dense(30, dtype="mixed_bfloat16")
            y = layer(x, training=True)
            return y, layer.backward(dy), layer.grads["kernel"].copy()
        finally:
            _core._force_simd_level("avx512")
            _core._bf16_allow_dot_instruction(True)
            _core._amx_allow(True)

    reference = step("baseline", False, False)
    for got, want in zip(step(level, False, False), reference):
        np.testing.assert_array_equal(got, want)
    for amx in (False, True):
        for got, want in zip(step(level, True, amx), reference):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dense_blocks_are_the_dense_products_of_one_input(level):
    """dense_forward_bf16_blocks (a self-attention's query, key and value from x paired once) is
    dense_forward_bf16 per kernel to the bit; its backward each kernel's and bias's gradient to the bit and
    dx the sum of the kernels' dx within float32 rounding, on float lanes, vdpbf16ps and AMX tiles."""
    rng = np.random.default_rng(31)
    widths = [16, 9, 70]  # an odd width, one past a 64-column panel
    x = rng.standard_normal((70, 33)).astype(np.float32)
    ks = [rng.standard_normal((33, w)).astype(np.float32) for w in widths]
    bs = [rng.standard_normal(widths[0]).astype(np.float32), None, rng.standard_normal(widths[2]).astype(np.float32)]
    dys = [rng.standard_normal((70, w)).astype(np.float32) for w in widths]
    for dot_instruction, amx in ((False, False), (True, False), (True, True)):
        _core._bf16_allow_dot_instruction(dot_instruction)
        _core._amx_allow(amx)
        try:
            outs = kernels.dense_forward_bf16_blocks(x=x, kernels=ks, biases=bs)
            dks, dbs = [np.ones_like(k) for k in ks], [None if b is None else np.ones_like(b) for b in bs]
            dx = kernels.dense_backward_bf16_blocks(dys=dys, x=x, kernels=ks, dkernels=dks, dbiases=dbs)
            want_dx, singles = np.zeros_like(x), []
            for j, (k, b, dy) in enumerate(zip(ks, bs, dys)):
                np.testing.assert_array_equal(outs[j], kernels.dense_forward_bf16(x=x, kernel=k, bias=b)[0])
                dk, db = np.ones_like(k), None if b is None else np.ones_like(b)
                dx_j = kernels.dense_backward_bf16(dy=dy, x=x, kernel=k, y=dy, z=dy, activation="linear", dkernel=dk,
                                                   dbias=db)
                want_dx += dx_j
                np.testing.assert_array_equal(dks[j], dk)
                if b is not None:
                    np.testing.assert_array_equal(dbs[j], db)
                singles.append((dk, db, dx_j))
            np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5)
            assert np.abs(dx - singles[0][2]).max() > 1  # the sum, not one block's
            assert kernels.dense_backward_bf16_blocks(dys=dys, x=x, kernels=ks, dkernels=dks, dbiases=dbs,
                                                      need_dx=False) is None
            for j, (dk, db, _) in enumerate(singles):  # accumulated again, as dense_backward_bf16 accumulates
                kernels.dense_backward_bf16(dy=dys[j], x=x, kernel=ks[j], y=dys[j], z=dys[j], activation="linear",
                                            dkernel=dk, dbias=db, need_dx=False)
                np.testing.assert_array_equal(dks[j], dk)
                if db is not None:
                    np.testing.assert_array_equal(dbs[j], db)
        finally:
            _core._bf16_allow_dot_instruction(True)
            _core._amx_allow(True)


def test_dense_blocks_refuse_bad_lists():
    x, k = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    with pytest.raises(ValueError, match="dense_forward_bf16_blocks: kernels must hold 1 to 4 kernels, got 0"):
        kernels.dense_forward_bf16_blocks(x=x, kernels=[], biases=[])
    with pytest.raises(ValueError, match="kernels must hold 1 to 4 kernels, got 5"):
        kernels.dense_forward_bf16_blocks(x=x, kernels=[k] * 5, biases=[None] * 5)
    with pytest.raises(ValueError, match="biases must hold one entry per kernel \\(2\\), got 1"):
        kernels.dense_forward_bf16_blocks(x=x, kernels=[k, k], biases=[None])
    with pytest.raises(ValueError, match="kernels\\[1\\]: expected shape \\(3, \\*\\), got \\(4, 2\\)"):
        kernels.dense_forward_bf16_blocks(x=x, kernels=[k, np.ones((4, 2), np.float32)], biases=[None, None])
    with pytest.raises(TypeError, match="kernels\\[0\\]: expected dtype float32"):
        kernels.dense_forward_bf16_blocks(x=x, kernels=[k.astype(np.float64)], biases=[None])
    with pytest.raises(ValueError, match="biases\\[0\\]: expected shape \\(2,\\)"):
        kernels.dense_forward_bf16_blocks(x=x, kernels=[k], biases=[np.ones(3, np.float32)])
    dy, dk = np.ones((4, 2), np.float32), np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="dense_backward_bf16_blocks: dys\\[0\\]: expected shape \\(4, 2\\)"):
        kernels.dense_backward_bf16_blocks(dys=[dy[:3]], x=x, kernels=[k], dkernels=[dk], dbiases=[None])
    with pytest.raises(ValueError, match="dkernels must hold one entry per kernel \\(1\\), got 2"):
        kernels.dense_backward_bf16_blocks(dys=[dy], x=x, kernels=[k], dkernels=[dk, dk], dbiases=[None])
    with pytest.raises(ValueError, match="dkernels\\[0\\]: .*(writeable|read-only)"):
        readonly = dk.copy()
        readonly.flags.writeable = False
        kernels.dense_backward_bf16_blocks(dys=[dy], x=x, kernels=[k], dkernels=[readonly], dbiases=[None])
    with pytest.raises(ValueError, match="dbiases\\[0\\]: expected shape \\(2,\\)"):
        kernels.dense_backward_bf16_blocks(dys=[dy], x=x, kernels=[k], dkernels=[dk], dbiases=[np.zeros(5, np.float32)])


# ----------------------------------------------------------------------------- the layer contract
def _with_dtype(config, dtype):
    """The config with every float64 dtype in it (the layer's, its sublayers') replaced by `dtype`."""
    if isinstance(config, dict):
        return {k: (dtype if k == "dtype" and v == "float64" else _with_dtype(v, dtype)) for k, v in config.items()}
    if isinstance(config, list):
        return [_with_dtype(v, dtype) for v in config]
    return config


def _layers_in(layer):
    yield layer
    for _, sub in layer._sublayers():
        yield from _layers_in(sub)


def _relative_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-4)


# A tensor zero in exact arithmetic (MultiHeadAttention's key bias gradient: the softmax ignores a shift of a
# row, so sum_s dscores[t, s] = 0) is rounding noise under either policy, float32's of its terms' size times
# 2**-24, bf16's (the scores' gradient rounded before dK = dS^T Q) of that size times 2**-9: it is held to that
# noise, relative to the layer's largest tensor, instead of to its own zero
ZERO_IN_EXACT_ARITHMETIC = 1e-6


# How far a tensor may move under bf16 depends on its conditioning, not on bf16 alone: a query gradient is the
# small difference the softmax's backward leaves of much larger terms, and a layer normalization over 4 features
# divides by a small spread, so rounding the operands by bf16's 2**-9 moves such a tensor by several percent
# whichever kernels run. As PyTorch's test_transformers calibrates its low-precision tolerances by a
# low-precision reference's deviation from the exact result (get_tolerances, times a fudge factor), the contract
# measures each tensor's sensitivity: float32 run on the bf16-rounded weights, inputs and output gradients (what
# every bf16 product at least rounds; the bf16 path also rounds the activations between products, hence the
# factor), and allows the larger of that and BF16_TOLERANCE.
SENSITIVITY_FACTOR = 3


def _float32_on_rounded_operands(model, weights, feed, dys, training):
    """float32 outputs and gradients of `model` (a float32 twin) on the bf16-rounded weights, float inputs and
    output gradients."""
    model.set_weights([_bf16(w).astype(np.float32) for w in weights])
    rounded = [_bf16(a).astype(np.float32) if np.asarray(a).dtype.kind == "f" else a for a in feed]
    return _run(model, rounded, [_bf16(d) for d in dys], training, 0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_layer_under_mixed_bfloat16(name):
    make, inputs = CASES[name]
    config = make().get_config()
    mixed = type(make()).from_config({**_with_dtype(config, "mixed_bfloat16"), "name": None})
    single, rounded = (type(make()).from_config({**_with_dtype(config, "float32"), "name": None}) for _ in "12")
    assert mixed.dtype_policy.name == "mixed_bfloat16" and mixed.get_config().get("dtype", "mixed_bfloat16") == \
        "mixed_bfloat16"  # (Bidirectional takes its layer's)
    assert type(mixed).from_config(mixed.get_config()).dtype_policy.name == "mixed_bfloat16"

    rng = np.random.default_rng(5)
    spec = inputs(rng, 3, 5)
    models = {}
    for key, layer in (("mixed", mixed), ("single", single), ("rounded", rounded)):
        symbolic_in, symbolic_out = _symbolic_call(layer, spec)
        models[key] = attnx.Model(symbolic_in, symbolic_out)
    single.set_weights(mixed.get_weights())
    assert all(w.dtype == np.float32 for w in mixed.get_weights())
    bf16 = any(layer.compute_dtype == "bfloat16" for layer in _layers_in(mixed))

    feed = [a for a, _ in spec]
    training = name not in TRAINING_EXEMPT
    outs, _ = _run(models["single"], feed, None, False, 0)
    dys = [rng.standard_normal(np.shape(o)) for o in outs]
    m_outs, m_grads = _run(models["mixed"], feed, dys, training, 0)
    s_outs, s_grads = _run(models["single"], feed, dys, training, 0)
    r_outs, r_grads = _float32_on_rounded_operands(models["rounded"], mixed.get_weights(), feed, dys, training)
    triples = list(zip(m_outs, s_outs, r_outs))
    triples += [(g, t, r) for g, t, r in zip(m_grads or [], s_grads or [], r_grads or []) if g is not None]
    triples += [(mixed.grads[k], single.grads[k], rounded.grads[k]) for k in mixed.grads] if training else []
    assert triples
    largest = max(np.linalg.norm(np.asarray(want, np.float64)) for _, want, _ in triples)
    for got, want, perturbed in triples:
        assert np.asarray(got).dtype == np.float32
        if bf16 and np.linalg.norm(np.asarray(want, np.float64)) < ZERO_IN_EXACT_ARITHMETIC * largest:
            assert np.linalg.norm(np.asarray(got, np.float64)) < 2**-9 * largest, f"{name}: bf16 noise on a zero"
        elif bf16:
            tolerance = max(BF16_TOLERANCE, SENSITIVITY_FACTOR * _relative_error(perturbed, want))
            assert _relative_error(got, want) < tolerance, f"{name}: bf16 result not float32's within bf16's"
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{name}: the float32 fallback differs from float32")
    if bf16:  # the products did run in bf16
        assert max(_relative_error(got, want) for got, want, _ in triples) > 1e-5, f"{name}: no bf16 rounding seen"


def test_tied_transformer_output_projection_in_bf16():
    """A Transformer with tie_output under mixed_bfloat16: the logits h E^T and their gradients (dh, dE) are
    bf16 products (float32's within bf16's tolerance, and rounded: not float32's), as the untied Dense is."""
    from attnx.translation import Transformer
    rng = np.random.default_rng(12)
    source, target = rng.integers(3, 40, (4, 7)), rng.integers(3, 40, (4, 6))
    target[:, 0] = 1
    made = {p: Transformer(40, 40, model_dim=16, num_heads=2, intermediate_dim=32, num_encoder_layers=1,
                           num_decoder_layers=1, dropout=0.0, tie_output=True, start_token=1, end_token=2, dtype=p)
            for p in ("float32", "mixed_bfloat16")}
    made["mixed_bfloat16"].set_weights(made["float32"].get_weights())
    h = rng.standard_normal((4, 6, 16)).astype(np.float32)
    dlogits = rng.standard_normal((4, 6, 40)).astype(np.float32)
    results = {}
    for policy, model in made.items():
        logits, cache = model._logits(h, training=True)
        model.target_embedding.grads["embeddings"][...] = 0
        dh = model._logits_backprop(cache, dlogits)
        results[policy] = (logits, dh, model.target_embedding.grads["embeddings"].copy())
    for got, want in zip(results["mixed_bfloat16"], results["float32"]):
        assert got.dtype == np.float32 and got.shape == want.shape
        assert 1e-5 < _relative_error(got, want) < BF16_TOLERANCE


# ----------------------------------------------------------------------------- models
def _small_transformer(**kwargs):
    from attnx.seq2seq import Transformer
    return Transformer(40, 40, model_dim=16, num_heads=2, intermediate_dim=32, num_encoder_layers=2,
                       num_decoder_layers=2, dropout=0.0, start_token=1, end_token=2, **kwargs)


@pytest.mark.parametrize("how", ["argument", "global policy"])
def test_transformer_gives_its_policy_to_every_layer(how, tmp_path):
    """seq2seq.Transformer(dtype="mixed_bfloat16"), or made under the global policy: every layer with products
    (attention projections, feed-forward, output projection) computes in bf16, everything else in float32 on
    float32 weights; its teacher-forced training step is float32's within bf16's tolerance; a saved model
    loads with the policy and predicts the same."""
    if how == "argument":
        model = _small_transformer(dtype="mixed_bfloat16")
    else:
        mixed_precision.set_global_policy("mixed_bfloat16")
        model = _small_transformer()
        mixed_precision.set_global_policy(None)
    assert model.dtype_policy.name == "mixed_bfloat16" and model.get_config()["dtype"] == "mixed_bfloat16"
    computes = {}
    for layer in _layers_in(model):
        computes.setdefault(type(layer).__name__, set()).add(layer.compute_dtype)
    assert computes.pop("MultiHeadAttention") == computes.pop("Dense") == {"bfloat16"}
    assert set().union(*computes.values()) == {"float32"}, computes
    assert all(w.dtype == np.float32 for w in model.get_weights())

    single = _small_transformer(dtype="float32")
    single.set_weights(model.get_weights())
    rng = np.random.default_rng(13)
    source, target = rng.integers(3, 40, (4, 7)), rng.integers(3, 40, (4, 6))
    target[:, 0] = 1
    dlogits = rng.standard_normal((4, 6, 40))
    results = {}
    for key, m in (("mixed", model), ("single", single)):
        m.zero_grad()
        logits, cache = m.apply([source, target], training=True)
        m.backprop(cache, dlogits)
        results[key] = [logits] + [m.grads[k].copy() for k in sorted(m.grads)]
    errors = [_relative_error(got, want) for got, want in zip(results["mixed"], results["single"])]
    # the whole model's gradients, as one vector, within bf16's tolerance (each tensor: the layer contract)
    flat = [np.concatenate([np.ravel(g) for g in results[k][1:]]) for k in ("mixed", "single")]
    assert _relative_error(results["mixed"][0], results["single"][0]) < BF16_TOLERANCE
    assert 1e-5 < _relative_error(*flat) < BF16_TOLERANCE and max(errors) > 1e-4

    model.compile()
    model.fit(source, target, epochs=1, batch_size=2, verbose=0)
    model.save(tmp_path / "t.attnx")
    loaded = attnx.load_model(tmp_path / "t.attnx")
    assert loaded.dtype_policy.name == "mixed_bfloat16"
    assert {layer.compute_dtype for layer in _layers_in(loaded) if type(layer).__name__ == "MultiHeadAttention"} == \
        {"bfloat16"}
    np.testing.assert_array_equal(loaded.predict(source, verbose=0), model.predict(source, verbose=0))


def test_saved_models_keep_the_policy(tmp_path):
    rng = np.random.default_rng(6)
    model = attnx.Sequential([
        layers.Embedding(20, 8, input_shape=(7,)),
        layers.LSTM(16, dtype="mixed_bfloat16"),
        layers.Dense(3, dtype="mixed_bfloat16"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy")
    x, y = rng.integers(0, 20, (32, 7)), rng.integers(0, 3, 32)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    path = tmp_path / "m.attnx"
    model.save(path)
    loaded = attnx.load_model(path)
    assert [layer.dtype_policy.name for layer in loaded.layers] == ["float32", "mixed_bfloat16", "mixed_bfloat16"]
    assert [layer.compute_dtype for layer in loaded.layers] == ["float32", "bfloat16", "bfloat16"]
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_transformer_learns_under_mixed_bfloat16_as_float32_does():
    """A small Transformer learns to reverse sequences under either policy: the same loss curve within bf16's
    noise, and greedy translations that are the reversed sources."""
    rng = np.random.default_rng(8)
    source = rng.integers(3, 40, (512, 6))
    target = np.concatenate([np.ones((512, 1), int), source[:, ::-1], np.full((512, 1), 2)], axis=1)
    results = {}
    for policy in ("float32", "mixed_bfloat16"):
        attnx.set_random_seed(0)
        model = _small_transformer(dtype=policy)
        model.compile(attnx.optimizers.Adam(0.01, beta_2=0.98))
        losses = model.fit(source, target, epochs=20, batch_size=32, verbose=0).history["loss"]
        predicted = model.predict(source[:64], verbose=0)[:, :7]
        results[policy] = losses, np.mean(np.all(predicted == target[:64, 1:], axis=1))
    (losses32, exact32), (losses16, exact16) = results["float32"], results["mixed_bfloat16"]
    assert losses32[-1] < 0.3 * losses32[0] and losses16[-1] < 0.3 * losses16[0]
    # (epoch by epoch the steep part of the curve shifts by a fraction of an epoch: compare where it settles)
    assert abs(np.mean(losses16[-5:]) - np.mean(losses32[-5:])) < 0.1, (losses32, losses16)
    assert exact32 > 0.3 and exact16 > 0.3, (exact32, exact16)


def test_training_under_the_global_policy_learns_as_float32_does():
    """The same small LSTM classifier trained under either policy reaches the same accuracy."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 12, 6)).astype(np.float32)
    y = (x[:, :, 0].sum(axis=1) > 0).astype(np.int64)

    def train(policy):
        mixed_precision.set_global_policy(policy)
        attnx.set_random_seed(0)
        model = attnx.Sequential([layers.LSTM(32, input_shape=(12, 6)), layers.Dense(2, activation="softmax")])
        model.compile(attnx.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
        history = model.fit(x, y, epochs=8, batch_size=32, verbose=0)
        assert all(w.dtype == np.float32 for w in model.get_weights())
        return history.history["accuracy"][-1], model.layers[0].compute_dtype

    acc32, dt32 = train("float32")
    acc16, dt16 = train("mixed_bfloat16")
    assert (dt32, dt16) == ("float32", "bfloat16")
    assert acc32 > 0.9 and abs(acc16 - acc32) < 0.05


# ----------------------------------------------------------------------------- the attention decoders
def _decoder_results(dec, inputs, dy):
    """Logits, attention weights, input gradients and weight gradients of one teacher-forced call."""
    ids, enc, states, source_mask, target_mask = inputs
    (logits, weights), cache = dec.apply([ids, enc] + states, training=True, mask=target_mask,
                                         source_mask=source_mask, return_attention_scores=True)
    dec.zero_grad()
    _, denc, *dstates = dec.backprop(cache, [dy, None])
    return [logits, weights, denc, *dstates] + [dec.grads[k].copy() for k in sorted(dec.grads)]


@pytest.mark.parametrize("variant", range(8))
def test_attention_decoders_under_mixed_bfloat16(variant):
    """The decoders' products over all steps take bf16 operands: every output and gradient is float32's within
    the contract's tolerance (float32 on the bf16-rounded weights and inputs calibrates it), and the rounding shows."""
    from test_seq2seq import DECODERS, make_decoder, make_inputs
    kind, score, cell, local_window = DECODERS[variant]
    mixed = make_decoder(kind, score, cell, local_window, dtype="mixed_bfloat16")
    single, rounded = (make_decoder(kind, score, cell, local_window) for _ in "12")
    assert mixed.compute_dtype == "bfloat16" and single.compute_dtype == "float32"
    single.set_weights(mixed.get_weights())
    rounded.set_weights([_bf16(w).astype(np.float32) for w in mixed.get_weights()])
    ids, enc, states, source_mask, target_mask = make_inputs(score, cell)
    dy = np.random.default_rng(3).standard_normal((enc.shape[0], ids.shape[1], mixed.vocab_size)).astype(np.float32)
    inputs = (ids, enc, states, source_mask, target_mask)
    got = _decoder_results(mixed, inputs, dy)
    want = _decoder_results(single, inputs, dy)
    perturbed = _decoder_results(rounded, (ids, _bf16(enc).astype(np.float32),
                                           [_bf16(s).astype(np.float32) for s in states], source_mask, target_mask),
                                 _bf16(dy).astype(np.float32))
    for g, w, p in zip(got, want, perturbed):
        assert g.dtype == np.float32
        # (the floor 1.5x: the steps' products also round the states they pass on, s_{t-1}, c_t and dgates, at
        # every step, which float32 on rounded weights and inputs cannot calibrate: the additive score vector's
        # gradient, a sum over dscores that add to zero per row, moved 2.1% here: 1.1% with float32 steps)
        tolerance = max(1.5 * BF16_TOLERANCE, SENSITIVITY_FACTOR * _relative_error(p, w))
        assert _relative_error(g, w) < tolerance
    assert max(_relative_error(g, w) for g, w in zip(got, want)) > 1e-5  # bf16 did run


def test_seq2seq_takes_the_global_policy_and_decodes_in_float32(tmp_path):
    """Seq2Seq made under mixed_bfloat16 hands the policy to its encoder and decoder and keeps it on save;
    greedy decoding runs float32 products, so it equals the float32 twin's decoding."""
    from attnx.seq2seq import Seq2Seq
    mixed_precision.set_global_policy("mixed_bfloat16")
    attnx.set_random_seed(0)
    model = Seq2Seq(20, 20, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=6)
    model.build(5)
    mixed_precision.set_global_policy(None)
    assert model.decoder.compute_dtype == "bfloat16" and model.encoder.rnn.compute_dtype == "bfloat16"
    twin = Seq2Seq(20, 20, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=6)
    twin.build(5)
    twin.set_weights(model.get_weights())
    rng = np.random.default_rng(0)
    enc, h0 = rng.standard_normal((4, 5, 16)).astype(np.float32), rng.standard_normal((4, 16)).astype(np.float32)
    ids = rng.integers(3, 20, 4)
    steps = [dec.step(ids, 0, dec.start_state(enc, [h0]))[0] for dec in (model.decoder, twin.decoder)]
    np.testing.assert_array_equal(steps[0], steps[1])
    assert len(model.greedy_decode(rng.integers(3, 20, (4, 5)))[0]) == 4
    model.save(tmp_path / "m.attnx")
    loaded = attnx.load_model(tmp_path / "m.attnx")
    assert loaded.decoder.dtype_policy.name == "mixed_bfloat16"
