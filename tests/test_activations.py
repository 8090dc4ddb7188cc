"""The float activations without libm (activations.hpp: tanh_rational, sigmoid_lanes, normal_lanes)
against float64 libm, through the public functions and the Activation layer, on every SIMD level:
the error bounds activations.hpp states, the exact values, NaN in -> NaN out; doubles keep libm."""
import math

import numpy as np
import pytest

import attnx
from attnx import layers

_HALF = (np.arange(80001) / 8000).astype(np.float32)
SWEEP = np.concatenate([-_HALF[:0:-1], _HALF])  # [-10, 10] in steps of 1.25e-4, symmetric to the bit
SPECIAL = np.array([0.0, 7.90531110763549805, -7.90531110763549805, 8.0, -8.0, 100.0, -100.0,
                    np.inf, -np.inf], dtype=np.float32)
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _phi(x):
    """The standard normal CDF in float64."""
    return 0.5 * _erfc(-x / math.sqrt(2.0))


def _reference(name, x):
    x = x.astype(np.float64)
    if name == "tanh":
        return np.tanh(x)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    return x * _phi(x)


def _reference_slope(name, x):
    x = x.astype(np.float64)
    y = _reference(name, x)
    if name == "tanh":
        return 1 - y * y
    if name == "sigmoid":
        return y * (1 - y)
    return _phi(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def test_tanh_within_its_bound_exact_at_the_clamp_and_odd(level):
    y = attnx.activations.tanh(SWEEP)
    assert y.dtype == np.float32
    assert np.max(np.abs(y - _reference("tanh", SWEEP))) < 4e-7
    assert np.array_equal(y, -y[::-1])  # odd to the bit (the sweep is symmetric about 0)
    assert np.all(np.abs(y) <= 1)
    special = attnx.activations.tanh(SPECIAL)
    assert special.tolist() == [0.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0]


def test_sigmoid_within_its_relative_bound_on_both_tails(level):
    y = attnx.activations.sigmoid(SWEEP)
    want = _reference("sigmoid", SWEEP)
    assert np.max(np.abs(y - want) / want) < 3e-7
    assert np.all((y >= 0) & (y <= 1))
    # relative precision where tanh's absolute error would be 0.3% (float holds sigmoid(-80) = 1.8e-35)
    far = np.array([-80.0, -40.0, -17.0], dtype=np.float32)
    assert np.allclose(attnx.activations.sigmoid(far), _reference("sigmoid", far), rtol=1e-6, atol=0)
    special = attnx.activations.sigmoid(SPECIAL)  # sigmoid(-100) = 3.7e-44 flushes to 0 with exp
    assert special[[0, 5, 6, 7, 8]].tolist() == [0.5, 1.0, 0.0, 1.0, 0.0]


def test_gelu_is_the_exact_erf_form_within_its_bounds(level):
    y = attnx.activations.gelu(SWEEP)
    nonzero = SWEEP != 0
    phi = _phi(SWEEP.astype(np.float64))
    assert np.max(np.abs(y[nonzero] / SWEEP[nonzero] - phi[nonzero])) < 2e-7
    negative = (SWEEP < 0) & (SWEEP >= -5)
    want = _reference("gelu", SWEEP)
    assert np.max(np.abs(y[negative] - want[negative]) / np.abs(want[negative])) < 1e-6
    # not the tanh approximation (Keras' approximate=True), which is 1.5e-4 away at x = -2.5
    assert abs(float(attnx.activations.gelu(np.float32([-2.5]))[0]) - want[SWEEP == -2.5][0]) < 1e-6
    special = attnx.activations.gelu(SPECIAL)
    assert special[0] == 0 and special[5] == 100 and special[6] == 0 and special[7] == np.inf


@pytest.mark.parametrize("name", ["tanh", "sigmoid", "gelu"])
def test_activation_layer_backward_matches_the_float64_slope(name, level, rng):
    x = SWEEP[::7].reshape(1, -1)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    layer = layers.Activation(name)
    layer(x, training=True)
    dx = layer.backward(dy)
    want = dy * _reference_slope(name, x)
    assert np.max(np.abs(dx - want) / (np.abs(dy) * (1 + np.abs(_reference_slope(name, x))))) < 1e-6


@pytest.mark.parametrize("name", ["tanh", "sigmoid", "gelu"])
def test_nan_in_nan_out(name, level):
    x = np.array([[np.nan, 0.5, np.nan, -3.0] * 5], dtype=np.float32)
    layer = layers.Activation(name)
    y = layer(x, training=True)
    dx = layer.backward(np.ones_like(x))
    assert np.array_equal(np.isnan(y), np.isnan(x)) and np.array_equal(np.isnan(dx), np.isnan(x))


@pytest.mark.parametrize("name", ["tanh", "sigmoid", "gelu"])
def test_doubles_keep_libm(name):
    x = np.linspace(-9, 9, 1001)
    assert np.allclose(getattr(attnx.activations, name)(x), _reference(name, x), rtol=1e-14, atol=1e-15)
