"""What the ported Keras tests use of `keras.src.testing.TestCase`, for attnx layers.

`run_layer_test` is Keras' layer battery cut to what attnx has: build on `input_shape`, an eager call
and a symbolic call giving `expected_output_shape`, the weight counts, a config round trip, and
`supports_masking`. Keras' seed-generator counts become "a dropout layer has a `seed`"; its
mixed-precision and TPU checks have no attnx counterpart.
"""
import numpy as np
from absl.testing import parameterized

import attnx


def assert_all_close(actual, expected, atol=1e-6, rtol=1e-6):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64),
                               atol=atol, rtol=rtol)


def assert_not_all_close(a, b, atol=1e-6, rtol=1e-6):
    assert not np.allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=rtol), "arrays are unexpectedly close"


def _is_shape(x):
    return isinstance(x, tuple) and all(d is None or isinstance(d, int) for d in x)


def _random(shape, dtype, rng):
    if isinstance(shape, list):
        return [_random(s, dtype, rng) for s in shape]
    if dtype is not None and np.dtype(dtype).kind in "iu":
        return rng.integers(0, 2, size=shape).astype(dtype)  # ids valid for any vocabulary
    return rng.random(shape).astype(dtype or "float32")


def _shapes(x):
    if isinstance(x, (list, tuple)):
        return [tuple(np.shape(v)) for v in x]
    return tuple(np.shape(x))


def _symbolic(shape, dtype):
    if isinstance(shape, list):
        return [_symbolic(s, dtype) for s in shape]
    return attnx.Input(shape=shape[1:], batch_size=shape[0], dtype=dtype or "float32")


def run_layer_test(layer_cls, init_kwargs, input_shape=None, input_dtype=None, input_data=None, call_kwargs=None,
                   expected_output_shape=None, expected_output=None, expected_num_trainable_weights=None,
                   expected_num_non_trainable_weights=None, expected_num_seed_generators=None,
                   expected_num_losses=None, supports_masking=None, expected_mask_shape=None, atol=1e-6, rtol=1e-6,
                   **ignored):
    call_kwargs = call_kwargs or {}
    rng = np.random.default_rng(0)
    layer = layer_cls(**init_kwargs)
    # config round trip (Keras: run_class_serialization_test)
    config = layer.get_config()
    twin = layer_cls.from_config(config)
    assert twin.get_config() == config
    if supports_masking:  # takes a mask, or makes one (Embedding(mask_zero=True))
        assert layer.supports_masking or "mask" in _forward_parameters(layer) or \
            type(layer).compute_mask is not attnx.layers.Layer.compute_mask
    if isinstance(input_shape, dict):  # Keras: keyword inputs, e.g. {"query_shape": ..., "value_shape": ...}
        named = {k[:-len("_shape")]: _random(v, input_dtype, rng) for k, v in input_shape.items()}
        output = layer(**named, **call_kwargs)
        symbolic = layer_cls(**init_kwargs)(**{k[:-len("_shape")]: _symbolic(v, input_dtype)
                                               for k, v in input_shape.items()}, **call_kwargs)
        _check_counts(layer, expected_num_trainable_weights, expected_num_non_trainable_weights,
                      expected_num_seed_generators, expected_num_losses)
        assert _shapes(output) == tuple(expected_output_shape)
        assert tuple(symbolic.shape) == (None,) + tuple(expected_output_shape)[1:] or \
            tuple(symbolic.shape) == tuple(expected_output_shape)
        return layer
    if input_data is None:
        input_data = _random(input_shape, input_dtype, rng)
    if input_shape is None:
        input_shape = _shapes(input_data)
    output = layer(input_data, **call_kwargs)
    if expected_output_shape is not None:
        got = _shapes(output)
        want = expected_output_shape
        if isinstance(want, (list, tuple)) and not _is_shape(want):
            want = [tuple(s) for s in want]
        assert got == want, f"output shape {got}, expected {want}"
    if expected_output is not None:
        assert_all_close(output, expected_output, atol=atol, rtol=rtol)
    _check_counts(layer, expected_num_trainable_weights, expected_num_non_trainable_weights,
                  expected_num_seed_generators, expected_num_losses)
    # the symbolic call (Keras: run_build_asserts / compute_output_spec)
    fresh = layer_cls(**init_kwargs)
    symbolic = fresh(_symbolic(input_shape, input_dtype), **call_kwargs)
    if expected_output_shape is not None:
        got = [tuple(t.shape) for t in symbolic] if isinstance(symbolic, (list, tuple)) else tuple(symbolic.shape)
        want = expected_output_shape
        if isinstance(want, (list, tuple)) and not _is_shape(want):
            want = [tuple(s) for s in want]
        assert got == want, f"symbolic output shape {got}, expected {want}"
    return layer


def _check_counts(layer, trainable, non_trainable, seed_generators, losses):
    if trainable is not None:
        assert len(layer.trainable_weights) == trainable
    if non_trainable is not None:
        assert len(layer.non_trainable_weights) == non_trainable
    if seed_generators:
        assert hasattr(layer, "seed"), "a layer that draws random numbers takes a seed"
    if losses is not None:
        assert len(layer.losses) == losses


def _forward_parameters(layer):
    import inspect
    function = type(layer).forward if not layer._runs_call() else type(layer).call
    return inspect.signature(function).parameters


class TestCase(parameterized.TestCase):
    """The assertions of Keras' `testing.TestCase` the ported files use (Keras' default tolerances 1e-6;
    the `tpu_*` tolerances do not apply on a CPU), on absl's parameterized TestCase as Keras'."""

    def assertAllClose(self, actual, expected, atol=1e-6, rtol=1e-6, tpu_atol=None, tpu_rtol=None, msg=None):
        assert_all_close(actual, expected, atol=atol, rtol=rtol)

    def assertNotAllClose(self, a, b, atol=1e-6, rtol=1e-6, msg=None):
        assert_not_all_close(a, b, atol=atol, rtol=rtol)

    def run_layer_test(self, layer_cls, init_kwargs, **kwargs):
        return run_layer_test(layer_cls, init_kwargs, **kwargs)
