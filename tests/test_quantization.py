"""int8 inference (model.quantize("int8")): the int8 products at every SIMD level against exact
integer arithmetic, every quantizable layer within TYPICAL_ERROR of its float32 output on ordinary
inputs (the bound under adversarial ones: test_quantization_contract.py), saving and loading a
quantized model, and the errors."""
import numpy as np
import pytest

import attnx
from attnx import _core, layers
from conftest import CPU_SIMD_LEVELS


# The largest error relative to the output's largest magnitude seen on inputs without outliers (normal
# features, random weights): what the guide calls typical, not a bound
TYPICAL_ERROR = 0.03


def _int8(rng, shape):
    return rng.integers(-127, 128, size=shape).astype(np.int8)


def _amx_int8_cpu():
    return bool(_core._config().get("cpu_amx_int8"))


# Every int8 instruction set this CPU can run: each SIMD level, and at AVX-512 on a CPU with AMX-INT8
# the VNNI tiles too (the AMX tiles off, _core._amx_allow)
INT8_PATHS = [*CPU_SIMD_LEVELS, *(["avx512 amx off"] if "avx512" in CPU_SIMD_LEVELS and _amx_int8_cpu() else [])]


@pytest.fixture(params=INT8_PATHS)
def int8_path(request):
    """The test runs at each SIMD level, and at AVX-512 with and without the AMX tiles where the CPU has
    them; the widest level with the tiles allowed after."""
    level = request.param.split()[0]
    _core._force_simd_level(level)
    _core._amx_allow(request.param == level)
    yield request.param
    _core._amx_allow(True)
    _core._force_simd_level("avx512")


# From R = 16 (8 where K > 64): the AMX tiles' shapes (16-row tiles and 32-row panels whole and partial, k
# blocks of 64 whole and partial, one or two 16-column tiles, K past one k block)
@pytest.mark.parametrize("R,K,N", [(1, 1, 1), (3, 7, 15), (5, 100, 400), (9, 257, 33), (2, 64, 1024),
                                   (8, 64, 20), (8, 100, 400), (12, 130, 17), (16, 64, 16), (17, 100, 400),
                                   (33, 257, 33), (64, 128, 70), (70, 1, 1), (40, 1024, 48)])
def test_int8_product_is_exact_at_each_level(int8_path, rng, R, K, N):
    qx, qw = _int8(rng, (R, K)), _int8(rng, (K, N))
    qx[:, ::5] = 127  # the extremes, where int16 pair sums would saturate without care
    qw[::3] = -127
    want = qx.astype(np.int64) @ qw.astype(np.int64)
    got = _core.int8_product(qx=qx, qw=qw)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)  # exact: every level gives the same integers


def test_int8_level_follows_the_simd_level(int8_path):
    expected = {"baseline": {"baseline"}, "avx2": {"avx2"}, "avx512": {"amx"} if _amx_int8_cpu() else {"avx2", "vnni"},
                "avx512 amx off": {"avx2", "vnni"}}[int8_path]
    assert _core.int8_level() in expected
    assert _core._config()["amx_int8"] == (_core.int8_level() == "amx")


def test_amx_tiles_give_the_vnni_tiles_bits(rng):
    """Where the CPU has AMX-INT8: a quantized model's outputs with the tiles and without, to the bit (the
    int32 sums are exact and the float epilogue is the same code), at batches whose products take the
    tiles (Dense rows, a recurrent layer's input projection and its steps at batch >= 16, the encoder's
    projections and feed-forward network) and at a batch whose steps do not."""
    if not _amx_int8_cpu():
        pytest.skip("no AMX-INT8 on this CPU")
    model = attnx.Sequential([layers.Embedding(50, 16), layers.LSTM(24, return_sequences=True),
                              layers.GRU(20, reset_after=False), layers.Dense(40, activation="relu"), layers.Dense(3)])
    dense = attnx.Sequential([layers.Dense(70, activation="relu", input_shape=(37,)), layers.Dense(5)])
    from attnx.interop import from_torch
    import torch
    torch.manual_seed(0)
    encoder = from_torch(torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval())
    runs = [(model, rng.integers(1, 50, size=(b, 9)).astype(np.int64)) for b in (3, 40)]
    runs.append((dense, rng.normal(size=(150, 37)).astype(np.float32)))
    runs.append((encoder, rng.normal(size=(4, 20, 32)).astype(np.float32)))
    for m, x in runs:
        m(x)
        m.quantize("int8")
    try:
        for m, x in runs:
            _core._amx_allow(True)
            assert _core.int8_level() == "amx"
            with_tiles = np.asarray(m(x))
            _core._amx_allow(False)
            np.testing.assert_array_equal(np.asarray(m(x)), with_tiles)
    finally:
        _core._amx_allow(True)


def test_quantize_rows_round_trip(rng):
    x = rng.normal(size=(6, 33)).astype(np.float32)
    x[4] = 0.0
    q, scale = _core.quantize_rows(x=x)
    assert q.dtype == np.int8 and scale.shape == (6,)
    np.testing.assert_array_equal(np.abs(q).max(axis=1), [127, 127, 127, 127, 0, 127])
    assert np.all(np.abs(x - q * scale[:, None]) <= scale[:, None] / 2 * 1.0001)


def test_quantize_rows_same_bytes_at_each_level(level, rng):
    x = rng.normal(size=(5, 77)).astype(np.float32)
    q, scale = _core.quantize_rows(x=x)
    np.testing.assert_array_equal(q, np.clip(np.rint(x / scale[:, None]), -127, 127).astype(np.int8))


def _quantize_rows_numpy(x):
    """The scheme of quantized.hpp's header in NumPy float32: scale = max|x| / 127, q = round half to
    even of x * (127 / max|x|)."""
    top = np.abs(x).max(axis=1)
    inv = np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), np.float32(0)).astype(np.float32)
    return np.clip(np.rint(x * inv[:, None]), -127, 127).astype(np.int8), top / np.float32(127)


@pytest.mark.parametrize("K", [1, 15, 17, 40, 100])
def test_quantize_activations_at_widths_off_16_lanes(level, rng, K):
    """Rows whose width leaves a partial vector and a partial group of the 16 reduction lanes, the
    largest magnitude in that tail: the kernel's bytes, scales and coarse rows are NumPy's."""
    x = rng.normal(size=(5, K)).astype(np.float32)
    x[1, -1] = -7.0  # the largest magnitude last
    x[2] = 0.0
    x[3, -1] = 1000.0  # an outlier the kernel does not use (its row zero): a coarse row when K > 1
    kernel = _int8(rng, (K, 9))
    if K > 1:
        kernel[-1] = 0
    q, scale, residual_q, residual_scale = _core.quantize_activations(x=x, kernel=kernel)
    want_q, want_scale = _quantize_rows_numpy(x)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(scale, want_scale)
    feature_weight = np.abs(kernel.astype(np.float64)).max(axis=1)
    residual = x - scale[:, None] * q.astype(np.float32)
    coarse = (np.abs(residual) @ feature_weight) * 16 > np.abs(x.astype(np.float64)) @ feature_weight
    assert coarse[3] == (K > 1) and not coarse[[0, 1, 2]].any()
    want_rq, want_rs = _quantize_rows_numpy(residual)
    np.testing.assert_array_equal(residual_q, np.where(coarse[:, None], want_rq, 0))
    np.testing.assert_array_equal(residual_scale, np.where(coarse, want_rs, 0))


# (name, layer factory, input factory): every quantizable layer kind and option
def _tokens(rng):
    return rng.integers(1, 50, size=(4, 9))


def _seq(rng, C=12):
    return rng.normal(size=(4, 9, C)).astype(np.float32)


def _masked(rng):
    x = _seq(rng)
    x[1, 6:] = 0.0
    x[3, 2:] = 0.0
    return x


CASES = [
    ("Dense", lambda: layers.Dense(24), lambda r: r.normal(size=(5, 30)).astype(np.float32)),
    ("Dense relu 3-D", lambda: layers.Dense(7, activation="relu", use_bias=False), _seq),
    ("Dense softmax", lambda: layers.Dense(5, activation="softmax"), lambda r: r.normal(size=(3, 16)).astype(np.float32)),
    ("Embedding", lambda: layers.Embedding(50, 16), _tokens),
    ("SimpleRNN", lambda: layers.SimpleRNN(20, return_sequences=True), _seq),
    ("GRU", lambda: layers.GRU(20, return_sequences=True), _seq),
    ("GRU classic", lambda: layers.GRU(20, reset_after=False, return_sequences=True), _seq),
    ("LSTM", lambda: layers.LSTM(33), _seq),
    ("LSTM sequences backwards", lambda: layers.LSTM(16, return_sequences=True, go_backwards=True), _seq),
    ("LSTM 2 levels states", lambda: layers.LSTM(16, num_layers=2, return_state=True), _seq),
    ("Bidirectional LSTM", lambda: layers.Bidirectional(layers.LSTM(16, return_sequences=True)), _seq),
    ("Bidirectional GRU", lambda: layers.Bidirectional(layers.GRU(10)), _seq),
    ("LSTMCell", lambda: layers.LSTMCell(16), lambda r: r.normal(size=(4, 12)).astype(np.float32)),
]


def _outputs(y):
    return [np.asarray(a) for a in (y if isinstance(y, list) else [y])]


@pytest.mark.parametrize("name,make,inputs", CASES, ids=[c[0] for c in CASES])
def test_every_quantizable_layer_within_the_error_bound(rng, name, make, inputs):
    layer = make()
    x = inputs(rng)
    want = _outputs(layer(x))
    layer.quantize("int8")
    assert layer.quantization_mode == "int8"
    got = _outputs(layer(x))
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == np.float32
        err = np.abs(g - w).max() / np.abs(w).max()
        assert err <= TYPICAL_ERROR, f"{name}: relative error {err:.4f}"
        assert not np.array_equal(g, w)  # the int8 path ran


def test_masked_recurrent_layers_carry_padded_steps(rng):
    x = _masked(rng)
    mask = np.abs(x).sum(-1) > 0
    for layer in (layers.LSTM(16, return_sequences=True, zero_output_for_mask=True),
                  layers.GRU(16, return_sequences=True, zero_output_for_mask=True)):
        want = layer(x, mask=mask)
        layer.quantize("int8")
        got = layer(x, mask=mask)
        np.testing.assert_array_equal(got[~mask], 0.0)
        assert np.abs(got - want).max() <= TYPICAL_ERROR * np.abs(want).max()


def test_levels_agree(rng):
    model = attnx.Sequential([layers.Embedding(50, 16), layers.LSTM(24), layers.Dense(3)])
    x = _tokens(rng)
    model.predict(x, verbose=0)
    model.quantize("int8")
    outs = []
    from conftest import CPU_SIMD_LEVELS
    try:
        for lv in CPU_SIMD_LEVELS:
            _core._force_simd_level(lv)
            outs.append(model.predict(x, verbose=0))
    finally:
        _core._force_simd_level("avx512")
    for o in outs[1:]:  # the same integers; the float epilogue may round differently (fused multiply-adds)
        np.testing.assert_allclose(o, outs[0], rtol=1e-4, atol=1e-5)


def _sentiment_like():
    inp = attnx.Input((9,), dtype="int64")
    h = layers.Embedding(50, 16, mask_zero=True)(inp)
    h = layers.Bidirectional(layers.LSTM(12, return_sequences=True))(h)
    h = layers.GRU(8)(h)
    out = layers.Dense(1, activation="sigmoid")(h)
    return attnx.Model(inp, out)


def test_model_quantize_save_and_load(rng, tmp_path):
    model = _sentiment_like()
    x = _tokens(rng)
    x[0, 5:] = 0
    want = model.predict(x, verbose=0)
    assert model.quantize("int8") is model
    got = model.predict(x, verbose=0)
    assert np.abs(got - want).max() <= TYPICAL_ERROR
    kinds = {n: p.dtype for n, p in model.params.items()}
    assert sum(d == np.int8 for d in kinds.values()) == 1 + 2 * 2 + 2 + 1  # embeddings, 2 x BiLSTM, GRU, Dense
    model.save(tmp_path / "q.attnx")
    loaded = attnx.load_model(tmp_path / "q.attnx")
    for (n, p), (m, q) in zip(model.params.items(), loaded.params.items()):
        assert p.dtype == q.dtype
        np.testing.assert_array_equal(p, q)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), got)
    model.quantize("int8")  # again: nothing left to quantize
    np.testing.assert_array_equal(model.predict(x, verbose=0), got)


def test_quantize_errors(rng):
    with pytest.raises(ValueError, match="not built"):
        attnx.Sequential([layers.Dense(3)]).quantize("int8")
    model = attnx.Sequential([layers.Dense(3)])
    model.predict(rng.normal(size=(2, 4)).astype(np.float32), verbose=0)
    with pytest.raises(ValueError, match="unknown quantization mode 'int4'"):
        model.quantize("int4")
    with pytest.raises(ValueError, match="Dense: unknown quantization mode"):
        layers.Dense(3, quantization_mode="fp8")
    model.quantize("int8")
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match="is quantized \\(int8\\) and runs inference only"):
        model.fit(rng.normal(size=(4, 4)).astype(np.float32), np.zeros((4, 3), np.float32), epochs=1, verbose=0)
    lstm = layers.LSTM(4)
    lstm(_seq(rng))
    lstm.quantize("int8")
    with pytest.raises(ValueError, match=f"Layer '{lstm.name}': is quantized"):
        lstm(_seq(rng), training=True)


def test_binding_checks(rng):
    with pytest.raises(ValueError, match="-128"):
        _core.int8_product(qx=np.full((2, 3), -128, np.int8), qw=np.zeros((3, 2), np.int8))
    with pytest.raises(TypeError, match="int8"):
        _core.int8_product(qx=np.zeros((2, 3), np.float32), qw=np.zeros((3, 2), np.int8))
    with pytest.raises(ValueError, match="kernel_scale"):
        _core.pack_int8(kernel=np.zeros((3, 2), np.int8), kernel_scale=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="-128"):
        _core.pack_int8(kernel=np.full((3, 2), -128, np.int8), kernel_scale=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="split must lie in \\[0, 2\\]"):
        _core.pack_int8(kernel=np.zeros((3, 2), np.int8), kernel_scale=np.zeros(2, np.float32), split=3)
    packed = _core.pack_int8(kernel=np.zeros((3, 2), np.int8), kernel_scale=np.zeros(2, np.float32))
    assert packed.shape == (3, 2) and packed.split == 2
    with pytest.raises(ValueError, match="expected a kernel packed as \\(4, 2\\)"):
        _core.dense_forward_int8(x=np.zeros((2, 4), np.float32), kernel=packed, bias=None)
    with pytest.raises(ValueError, match="split at column 4"):  # a classic GRU's recurrent kernel splits at 2 H
        _core.rnn_forward_int8(cell="gru", x=np.zeros((1, 2, 3), np.float32),
                               kernel=_core.pack_int8(kernel=np.zeros((3, 6), np.int8),
                                                      kernel_scale=np.ones(6, np.float32)),
                               recurrent_kernel=_core.pack_int8(kernel=np.zeros((2, 6), np.int8),
                                                                kernel_scale=np.ones(6, np.float32)),
                               bias=None, recurrent_bias=None, h0=None, c0=None, mask=None, reset_after=False)
    with pytest.raises(IndexError):
        _core.embedding_forward_int8(ids=np.array([5]), table=np.zeros((3, 2), np.int8), scale=np.ones(3, np.float32))


def _packed_kernel(rng, K, N):
    q, scale = attnx.quantization.quantize_matrix(rng.normal(size=(K, N)).astype(np.float32), "columns")
    return _core.pack_int8(kernel=q, kernel_scale=scale)


def test_fused_int8_kernels_equal_their_dense_products(int8_path, rng):
    """feed_forward_forward_int8 is two dense_forward_int8 calls, and dense_forward_int8_blocks their
    columns in blocks, to the bit (rows past a 64-row chunk, an outlier row taking the second pass)."""
    x = rng.normal(size=(150, 24)).astype(np.float32)
    x[::9, 3] = 500.0
    w1, w2 = _packed_kernel(rng, 24, 40), _packed_kernel(rng, 40, 7)
    b1, b2 = rng.normal(size=40).astype(np.float32), rng.normal(size=7).astype(np.float32)
    hidden = _core.dense_forward_int8(x=x, kernel=w1, bias=b1, activation="gelu")
    want = _core.dense_forward_int8(x=hidden, kernel=w2, bias=b2)
    got = _core.feed_forward_forward_int8(x=x, kernel1=w1, bias1=b1, kernel2=w2, bias2=b2, activation="gelu")
    np.testing.assert_array_equal(got, want)
    blocks = _core.dense_forward_int8_blocks(x=x, kernel=w1, bias=b1, widths=[16, 9, 15], activation="relu")
    assert [b.shape for b in blocks] == [(150, 16), (150, 9), (150, 15)] and all(b.flags.c_contiguous for b in blocks)
    np.testing.assert_array_equal(np.concatenate(blocks, axis=1),
                                  _core.dense_forward_int8(x=x, kernel=w1, bias=b1, activation="relu"))


def test_fused_int8_binding_checks(rng):
    w1, w2 = _packed_kernel(rng, 4, 6), _packed_kernel(rng, 5, 3)
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="kernel2: expected a kernel packed as \\(6, 3\\)"):
        _core.feed_forward_forward_int8(x=x, kernel1=w1, bias1=None, kernel2=w2, bias2=None)
    with pytest.raises(ValueError, match="bias1"):
        _core.feed_forward_forward_int8(x=x, kernel1=w1, bias1=np.zeros(5, np.float32),
                                        kernel2=_packed_kernel(rng, 6, 3), bias2=None)
    for widths in ([2, 3], [6, 0], [], [1, 1, 1, 1, 2]):
        with pytest.raises(ValueError, match="widths must be 1 to 4 positive column counts summing to the kernel's 6"):
            _core.dense_forward_int8_blocks(x=x, kernel=w1, bias=None, widths=widths)
