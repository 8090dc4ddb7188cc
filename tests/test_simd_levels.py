"""The run-time SIMD dispatch: what show_config reports, the test switch, and inputs near the
bottom of the float range (subnormals, ~1e-39) on every level the CPU has: the kernels give the
float64 results for them on each level (their cost is benchmarks/bench_denormals.py's to print;
tests never assert timings)."""
import io

import numpy as np
import pytest

import attnx
from attnx import _core, layers

from conftest import CPU_SIMD_LEVELS as CPU_LEVELS


def test_show_config_names_level_blas_core_and_threads():
    out = io.StringIO()
    attnx.show_config(file=out)
    text = out.getvalue()
    assert f"SIMD level:  {_core._config()['simd_level']}" in text
    assert "OpenBLAS core:" in text and "threads:" in text


def test_forced_level_is_the_one_that_runs(level):
    assert _core._config()["simd_level"] == level


def test_force_simd_level_rejects_unknown_names():
    with pytest.raises(ValueError, match="avx512"):
        _core._force_simd_level("sse9")
    assert _core._config()["simd_level"] == CPU_LEVELS[-1]


def _twin(make, x):
    """The layer in float32 and float64 with the same weights."""
    attnx.set_random_seed(0)
    f32 = make("float32")
    f32(x)
    f64 = make("float64")
    f64(x.astype(np.float64))
    f64.set_weights([w.astype(np.float64) for w in f32.get_weights()])
    return f32, f64


@pytest.mark.parametrize("make, shape", [
    (lambda dt: layers.LSTM(100, return_sequences=True, dtype=dt), (5, 7, 20)),
    (lambda dt: layers.GRU(40, return_sequences=True, dtype=dt), (3, 6, 17)),
    (lambda dt: layers.TransformerEncoderLayer(2, 48, dtype=dt), (2, 9, 24)),
    (lambda dt: layers.LayerNormalization(dtype=dt), (4, 33)),
    (lambda dt: layers.AttentionPooling(dtype=dt), (3, 70, 16)),
    (lambda dt: layers.Conv2D(12, 3, padding="same", activation="tanh", dtype=dt), (2, 9, 7, 5)),
    (lambda dt: layers.Conv2D(6, 3, padding="valid", activation="tanh", dtype=dt), (2, 9, 8, 10)),  # Winograd
    (lambda dt: layers.MaxPooling2D(2, dtype=dt), (2, 8, 6, 20)),
    (lambda dt: layers.AveragePooling2D(3, strides=2, padding="same", dtype=dt), (2, 9, 7, 20)),
])
@pytest.mark.parametrize("scale", [1e-39, 1e-42])
def test_subnormal_inputs_give_the_float64_results(make, shape, scale, level):
    rng = np.random.default_rng(0)
    x = (rng.uniform(-1, 1, shape) * scale).astype(np.float32)
    assert np.count_nonzero(x) and np.all(np.abs(x) < np.finfo(np.float32).tiny)  # subnormal floats
    f32, f64 = _twin(make, x)
    dy = rng.uniform(-1, 1, np.shape(f32(x))).astype(np.float32)
    for layer, dt in ((f32, np.float32), (f64, np.float64)):
        layer.zero_grad()
        layer(x.astype(dt), training=True)
    dx32, dx64 = f32.backward(dy), f64.backward(dy.astype(np.float64))
    y32, y64 = f32(x), f64(x.astype(np.float64))
    assert np.all(np.isfinite(y32)) and np.all(np.isfinite(dx32))
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dx32, dx64, rtol=1e-3, atol=1e-4 * np.abs(dx64).max() + 1e-30)
    for k in f32.grads:
        np.testing.assert_allclose(f32.grads[k], f64.grads[k], rtol=1e-3, atol=1e-4 * np.abs(f64.grads[k]).max() + 1e-30,
                                   err_msg=k)


def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


GAMMA = np.uint64(0x9E3779B97F4A7C15)


def _stream_keep(rows, cols, rate, key, first_row):
    """NumPy's copy of attnx.random's keep mask (random.hpp): row r's key is
    fold_in(key, first_row + r) = mix64(key ^ mix64(first_row + r + gamma)); its word w =
    mix64(row key + (w + 1) gamma) holds the 16-bit uniforms of entries 4w .. 4w + 3, lowest bits first."""
    with np.errstate(over="ignore"):
        row = np.arange(rows, dtype=np.uint64) + np.uint64(first_row)
        row_key = _mix64(np.uint64(key) ^ _mix64(row + GAMMA))
        words = np.arange(1, (cols + 3) // 4 + 1, dtype=np.uint64)
        z = _mix64(row_key[:, None] + words[None, :] * GAMMA)
    uniforms = (z[:, :, None] >> (np.uint64(16) * np.arange(4, dtype=np.uint64))) & np.uint64(0xFFFF)
    return np.where(uniforms.reshape(rows, -1)[:, :cols] >= round(rate * 65536), 1 / (1 - rate), 0.0)


@pytest.mark.parametrize("n", [1, 7, 1024, 4 * 256 + 3, 200 * 501])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dropout_mask_is_the_counter_stream_on_every_level(level, n, dtype):
    """The same stream on every SIMD level and thread split, to the last entry of a partial draw."""
    for key, rate, first_row in ((42, 0.25, 0), (2 ** 63 + 5, 0.1, 9)):
        keep = _core.random_keep([3, n], rate, key, first_row, np.dtype(dtype))
        np.testing.assert_array_equal(keep, _stream_keep(3, n, rate, key, first_row).astype(dtype))


@pytest.mark.parametrize("n", [1, 15, 33, 1027])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("l1, l2", [(0.0, 0.07), (0.02, 0.07)])
def test_l1l2_regularization_kernels_on_every_level(level, n, dtype, l1, l2):
    """The penalty (accumulated in double) and the gradient added in place, on lengths that end in
    partial vectors, with zeros (sign 0) among the weights; a gradient that is not a contiguous
    buffer of the weights' dtype gets the same update through NumPy."""
    rng = np.random.default_rng(n)
    reg = attnx.regularizers.L1L2(l1, l2)
    w = rng.standard_normal(n).astype(dtype)
    w[::7] = 0
    w64 = w.astype(np.float64)
    assert reg(w) == pytest.approx(l1 * np.abs(w64).sum() + l2 * np.square(w64).sum(), rel=1e-12)
    grad = rng.standard_normal(n).astype(dtype)
    want = grad + l1 * np.sign(w64) + 2 * l2 * w64
    reg.add_gradient(w, grad)
    np.testing.assert_allclose(grad, want, rtol=1e-6, atol=1e-7 if dtype == "float32" else 1e-12)
    strided = np.zeros(2 * n, np.float64)[::2]
    reg.add_gradient(w, strided)
    np.testing.assert_allclose(strided, l1 * np.sign(w64) + 2 * l2 * w64, rtol=1e-6, atol=1e-12)
