"""int8 in the compiled inference plan (attnx.models.plan): a quantized model's model(x), predict_on_batch
and predict run its plan, whose int8 ops call the kernels the layers' eager forwards call on the same packed
kernels, so the outputs are the eager int8 path's bit for bit, for every quantizable layer the plan lowers."""
import numpy as np
import pytest

import attnx
from attnx import backend, layers
from attnx.models import plan

from test_predict_plan import eager, float_model, ids, token_model


def _with_outliers(rng, x):
    """x with one large feature in some rows: those rows take the int8 second pass (coarse rows)."""
    x = x.copy()
    x[..., 0][rng.random(x.shape[:-1]) < 0.3] = 500.0
    return x


# One quantized model per layer class the plan lowers in int8 (the contract below fails when an int8 lowering
# has none): float, token and padded inputs, every recurrent cell and level, outliers
def _cases():
    return {
        layers.Embedding: lambda rng, T: (token_model(rng, layers.Dense(3), steps=T), ids(rng, 4, T)),
        layers.Dense: lambda rng, T: (float_model((T, 5), layers.Dense(7, activation="relu"),
                                                  layers.Dense(3, activation="softmax", use_bias=False)),
                                      _with_outliers(rng, rng.normal(size=(3, T, 5)).astype(np.float32))),
        layers.LSTM: lambda rng, T: (token_model(rng, layers.LSTM(9, return_sequences=True, zero_output_for_mask=True),
                                                 layers.LSTM(5, num_layers=2)), ids(rng, 5, T)),
        layers.GRU: lambda rng, T: (float_model((T, 4), layers.GRU(8, go_backwards=True),),
                                    _with_outliers(rng, rng.normal(size=(3, T, 4)).astype(np.float32))),
        layers.SimpleRNN: lambda rng, T: (float_model((T, 4), layers.SimpleRNN(6, return_sequences=True),
                                                      layers.GRU(4, reset_after=False, activation="relu")),
                                          rng.normal(size=(2, T, 4)).astype(np.float32)),
        layers.Bidirectional: lambda rng, T: (token_model(
            rng, layers.Bidirectional(layers.GRU(6, return_sequences=True, num_layers=2)),
            layers.Bidirectional(layers.LSTM(5), merge_mode="ave")), ids(rng, 4, T)),
        layers.FeedForward: lambda rng, T: (float_model((T, 8), layers.FeedForward(16, activation="gelu")),
                                            _with_outliers(rng, rng.normal(size=(2, T, 8)).astype(np.float32))),
        # (no pooling after them: the plan's masked mean and the eager path's NumPy one round apart)
        layers.TransformerEncoderLayer: lambda rng, T: (token_model(
            rng, layers.PositionalEncoding(), layers.TransformerEncoderLayer(2, 12, norm_first=True)),
                                                        ids(rng, 4, T)),
        layers.TransformerEncoder: lambda rng, T: (token_model(
            rng, layers.TransformerEncoder(2, num_heads=4, intermediate_dim=32),
            layers.Dense(2, activation="softmax")), ids(rng, 5, T)),
    }


def _quantized(make, rng, steps):
    model, x = make(rng, steps)
    model(x)  # built
    model.quantize("int8")
    return model, x


def test_every_int8_lowering_has_a_case_and_every_other_lowered_layer_stays_float():
    int8 = {cls for cls, lowering in plan.LOWERINGS.items() if lowering.int8}
    assert set(_cases()) == int8
    # a lowered class the plan refuses in int8 must have nothing to quantize (it stays float32 in a quantized model)
    from test_predict_plan import _cases as float_cases
    rng = np.random.default_rng(0)
    for cls, make in float_cases().items():
        if cls in int8:
            continue
        model, x = make(rng, 4)
        model(x)
        for layer in model.layers:
            if isinstance(layer, cls):
                assert not layer.quantizable_weights(), f"{cls.__name__} is quantizable but has no int8 lowering"


@pytest.mark.parametrize("cls", list(_cases()), ids=lambda c: c.__name__)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_plan_output_equals_eager_int8_bit_for_bit(cls, seed, threads):
    rng = np.random.default_rng(seed)
    attnx.set_random_seed(seed)
    was = backend.get_num_threads()
    backend.set_num_threads(threads)
    try:
        model, x = _quantized(_cases()[cls], rng, int(rng.integers(1, 9)))
        assert any(layer.quantization_mode for layer in model.layers if isinstance(layer, cls))
        planned = plan.run(model, x)
        assert planned is not None, f"{cls.__name__}: the plan declined the quantized model"
        expected = eager(model, x)
        np.testing.assert_array_equal(planned, expected)
        for call in (model, model.predict_on_batch, model.predict):
            np.testing.assert_array_equal(call(x), expected)
        batch = x[:1]  # another signature: a plan of its own
        np.testing.assert_array_equal(model(batch), eager(model, batch))
    finally:
        backend.set_num_threads(was)


def test_the_int8_plan_differs_from_the_float_plan():
    # the plan must run the int8 kernels, not the float ones it held before quantize
    rng = np.random.default_rng(3)
    model = float_model((6, 16), layers.Dense(32, activation="relu"), layers.Dense(4))
    x = rng.normal(size=(8, 6, 16)).astype(np.float32)
    float_out = model.predict(x)
    model.quantize("int8")
    int8_out = model.predict(x)
    assert plan.run(model, x) is not None
    assert not np.array_equal(float_out, int8_out)
    np.testing.assert_allclose(int8_out, float_out, atol=0.05 * np.abs(float_out).max())


def test_set_weights_and_loading_rebuild_the_int8_plan(tmp_path):
    rng = np.random.default_rng(4)
    model = token_model(rng, layers.LSTM(12, return_sequences=True, zero_output_for_mask=True), layers.Dense(3))
    x = ids(rng, 6, 7)
    model(x)
    model.quantize("int8")
    before = model.predict(x)
    assert plan.run(model, x) is not None
    weights = model.get_weights()
    changed = [w[::-1].copy() if w.dtype == np.int8 and w.ndim == 2 else w for w in weights]
    model.set_weights(changed)  # in place: the packed kernels are made again, so is the plan
    after = model.predict(x)
    assert not np.array_equal(before, after)
    np.testing.assert_array_equal(after, eager(model, x))
    model.set_weights(weights)
    np.testing.assert_array_equal(model.predict(x), before)
    model.save(tmp_path / "m.attnx")
    loaded = attnx.load_model(tmp_path / "m.attnx")
    np.testing.assert_array_equal(loaded.predict(x), before)
    assert plan.run(loaded, x) is not None


def test_the_quantized_sentiment_model_runs_its_plan():
    from test_predict_plan import sentiment_model
    rng = np.random.default_rng(5)
    model = sentiment_model()
    for batch in (1, 32):
        x = ids(rng, batch, 32, 500)
        model(x)
    model.quantize("int8")
    for batch in (1, 7, 32):
        x = ids(rng, batch, 32, 500)
        assert plan.run(model, x) is not None
        np.testing.assert_array_equal(model.predict(x), eager(model, x))
