"""The inference plan keeps a packed copy of each recurrent kernel between calls (plan.hpp's PackedCopy,
remade when the kernel's bytes change), and a recurrent layer over an embedding a table of the embedding's
rows times its kernel (EmbeddedProjection, rows remade when their embedding row, the kernel or the bias
change): after every way a weight changes in place, the plan's outputs are the eager path's for the new
weights, never the old ones."""
import copy

import numpy as np
import pytest

import attnx
from attnx import _core, layers
from attnx.models import plan

from conftest import CPU_SIMD_LEVELS


def eager(model, x):
    return model._run_graph(x, False, None)[0]


def ids(rng, batch, steps, vocab=200):
    return rng.integers(1, vocab, (batch, steps))


def lstm_pooling(rng, batch):
    """The benchmark's recurrent part, LSTM(100) + AttentionPooling over 32 steps (its steps on the kept
    packed kernel), on inputs large enough that a change of the kernel shows in the outputs."""
    model = attnx.Sequential([layers.LSTM(100, return_sequences=True, input_shape=(32, 16)),
                              layers.AttentionPooling()])
    return model, rng.normal(size=(batch, 32, 16)).astype(np.float32)


def bidirectional_gru(rng, batch):
    model = attnx.Sequential([layers.Embedding(200, 16, input_shape=(12,), mask_zero=True),
                              layers.Bidirectional(layers.GRU(24, return_sequences=True, num_layers=2)),
                              layers.GlobalAveragePooling1D(), layers.Dense(3)])
    x = ids(rng, batch, 12)
    x[:, -3:] = 0  # padded steps
    model(x)
    model.layers[0].params["embeddings"][...] *= 30  # (the initial ones are too small to show a change)
    return model, x


def sentiment(rng, batch):
    """The benchmark's sentiment model, smaller: its LSTM takes its inputs from a table of the embedding's
    rows projected by its kernel (plan.hpp's EmbeddedProjection)."""
    model = attnx.Sequential([layers.Embedding(200, 16, input_shape=(32,)), layers.LSTM(24, return_sequences=True),
                              layers.AttentionPooling(), layers.Dense(1)])
    x = ids(rng, batch, 32)
    model(x)
    model.layers[0].params["embeddings"][...] *= 30
    return model, x


MODELS = {"LSTM": lstm_pooling, "BiGRU": bidirectional_gru, "Embedding-LSTM": sentiment}


def _recurrent(model):
    return next(layer for layer in model.layers if isinstance(layer, (layers.LSTM, layers.Bidirectional)))


def _recurrent_kernel(model):
    layer = _recurrent(model)
    return layer.params["recurrent_kernel" if "recurrent_kernel" in layer.params else
                        next(name for name in layer.params if name.endswith("recurrent_kernel"))]


def _fit(model, x, tmp_path):
    model.compile(attnx.optimizers.Adam(0.05), "mse")
    model.fit(x, np.ones(model(x).shape, np.float32), epochs=1, batch_size=len(x), verbose=0)


def _optimizer_apply(model, x, tmp_path):
    params = [p for p in model.weights if "recurrent_kernel" in _name_of(model, p)]
    attnx.optimizers.SGD(0.5).apply([(p, np.ones_like(p)) for p in params])


def _name_of(model, array):
    return next(name for name, p in model.params.items() if p is array)


def _set_weights(model, x, tmp_path):
    model.set_weights([w * 0.5 for w in model.get_weights()])


def _layer_set_weights(model, x, tmp_path):
    layer = _recurrent(model)
    layer.set_weights([w + 0.05 for w in layer.get_weights()])


def _load_weights(model, x, tmp_path):
    other = copy.deepcopy(model)
    other.set_weights([w + np.random.default_rng(5).normal(scale=0.3, size=w.shape) for w in other.get_weights()])
    other.save_weights(tmp_path / "other.attnx")
    model.load_weights(tmp_path / "other.attnx")


def _checkpoint_restore(model, x, tmp_path):
    saved = [w.copy() for w in model.weights]
    checkpoint = attnx.train.Checkpoint(model=model)
    path = checkpoint.write(str(tmp_path / "ckpt"))
    for w in model.weights:
        w[...] = 0.1  # the plan runs once on these, then the restore writes the saved values back
    planned = model(x)
    checkpoint.restore(path)
    for w, s in zip(model.weights, saved):
        np.testing.assert_array_equal(w, s)
    return planned


def _params_in_place(model, x, tmp_path):
    _recurrent_kernel(model)[...] *= -1.0


def _one_element_in_place(model, x, tmp_path):
    _recurrent_kernel(model)[3, 7] += 50.0  # (one value; large enough to show through the model)


def _weights_item_in_place(model, x, tmp_path):
    layer = _recurrent(model)
    i = [name for name in layer.params].index(_name_of(layer, _recurrent_kernel(model)))
    layer.weights[i][...] = np.random.default_rng(9).normal(scale=0.2, size=layer.weights[i].shape)


CHANGES = {"fit": _fit, "optimizer.apply": _optimizer_apply, "model.set_weights": _set_weights,
           "layer.set_weights": _layer_set_weights, "load_weights": _load_weights,
           "Checkpoint.restore": _checkpoint_restore, "params[...] in place": _params_in_place,
           "one element in place": _one_element_in_place, "weights[i][...] in place": _weights_item_in_place}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("batch", [1, 3])
def test_the_plan_sees_every_kind_of_weight_change(change, kind, batch, tmp_path):
    attnx.set_random_seed(0)
    model, x = MODELS[kind](np.random.default_rng(0), batch)
    before = model(x)
    assert plan.run(model, x) is not None  # the plan ran (and packed its recurrent kernels)
    np.testing.assert_allclose(model(x), eager(model, x), rtol=2e-5, atol=2e-6)
    planned = CHANGES[change](model, x, tmp_path)  # the plan's last outputs before the change, if it ran since
    assert_predictions_follow(model, x, before if planned is None else planned)


def assert_predictions_follow(model, x, before):
    """After a weight change: the eager outputs moved far from `before` (so that a stale plan, which
    still gives `before`, fails by far), and every predict path gives the eager outputs."""
    expected = eager(model, x)
    assert not np.allclose(expected, before, rtol=2e-3, atol=2e-4), "the change must show in the outputs"
    for call in (model, model.predict_on_batch, model.predict):
        np.testing.assert_allclose(call(x), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("make, batch", [(lstm_pooling, 1), (sentiment, 3)], ids=["lstm_pooling", "sentiment"])
def test_what_a_plan_made_at_one_simd_level_is_made_again_at_another(make, batch):
    """The packed recurrent kernel (LSTM + pooling) and the embedding table (sentiment)."""
    model, x = make(np.random.default_rng(1), batch)
    expected = eager(model, x)
    try:
        for level in CPU_SIMD_LEVELS[::-1] + CPU_SIMD_LEVELS:  # each level's panels after another's
            _core._force_simd_level(level)
            np.testing.assert_allclose(model(x), expected, rtol=2e-5, atol=2e-6, err_msg=level)
    finally:
        _core._force_simd_level(CPU_SIMD_LEVELS[-1])


def test_plans_of_two_models_sharing_a_layer_see_its_changes():
    rng = np.random.default_rng(2)
    shared = layers.LSTM(16)
    inputs = attnx.Input((10, 4))
    first, second = attnx.Model(inputs, layers.Dense(2)(shared(inputs))), attnx.Model(inputs, shared(inputs))
    x = rng.normal(size=(1, 10, 4)).astype(np.float32)
    first(x), second(x)
    shared.params["recurrent_kernel"][...] += 0.3
    for model in (first, second):
        np.testing.assert_allclose(model(x), eager(model, x), rtol=2e-5, atol=2e-6)


def _input_weights(model):
    """The embedding and the first recurrent level's input kernel and bias (each direction's) of a model
    whose recurrent layer takes the embedding's table."""
    recurrent = _recurrent(model)
    directions = [recurrent] if isinstance(recurrent, layers.LSTM) else [recurrent.forward_layer,
                                                                         recurrent.backward_layer]
    return (model.layers[0].params["embeddings"], [d.params["kernel"] for d in directions],
            [d.params["bias"] for d in directions])


def _embedding_row_read(model, x, tmp_path):
    _input_weights(model)[0][x[0, 3]] *= -1.0  # a row this call reads (x[0, 3] is no padding)


def _embedding_row_unread(model, x, tmp_path):
    row = x[0, 3]  # made by the call before; a call that does not read it, then the change
    model(np.where(x == row, 1 if row != 1 else 2, x))
    _input_weights(model)[0][row] *= -1.0


def _embedding_whole(model, x, tmp_path):
    _input_weights(model)[0][...] = np.random.default_rng(3).normal(scale=1.0, size=_input_weights(model)[0].shape)


def _kernel_in_place(model, x, tmp_path):
    for kernel in _input_weights(model)[1]:
        kernel[...] *= -1.0


def _kernel_one_element(model, x, tmp_path):
    for kernel in _input_weights(model)[1]:
        kernel[2, 5] += 50.0


def _bias_in_place(model, x, tmp_path):
    for bias in _input_weights(model)[2]:
        bias[...] += 2.0


def _sgd_on_the_input_weights(model, x, tmp_path):
    embedding, kernels, biases = _input_weights(model)
    attnx.optimizers.SGD(0.5).apply([(p, np.ones_like(p)) for p in [embedding] + kernels + biases])


TABLE_CHANGES = {"embedding row read, in place": _embedding_row_read,
                 "embedding row changed while unread": _embedding_row_unread,
                 "embedding whole, in place": _embedding_whole, "kernel in place": _kernel_in_place,
                 "kernel one element": _kernel_one_element, "bias in place": _bias_in_place,
                 "optimizer.apply": _sgd_on_the_input_weights, "fit": _fit, "model.set_weights": _set_weights,
                 "load_weights": _load_weights}


@pytest.mark.parametrize("change", list(TABLE_CHANGES))
@pytest.mark.parametrize("kind", ["Embedding-LSTM", "BiGRU"])
@pytest.mark.parametrize("batch", [1, 20])
def test_the_embedding_table_sees_every_change_of_what_it_was_made_from(change, kind, batch, tmp_path):
    attnx.set_random_seed(0)
    model, x = MODELS[kind](np.random.default_rng(0), batch)
    before = model(x)
    assert plan.run(model, x) is not None
    TABLE_CHANGES[change](model, x, tmp_path)
    assert_predictions_follow(model, x, before)
