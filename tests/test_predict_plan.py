"""The compiled inference plan (attnx.models.plan): model(x), predict_on_batch and predict run one C++ call
that gives the eager path's outputs, for every layer class the plan lowers; anything else falls back."""
import numpy as np
import pytest

import attnx
from attnx import data_adapter, layers
from attnx.models import plan

RNG_SEEDS = range(3)


def eager(model, x):
    """The eager path's outputs: the functional graph run layer by layer."""
    return model._run_graph(x, False, None)[0]


def ids(rng, batch, steps, vocab=50, padded=True):
    x = rng.integers(1, vocab, (batch, steps))
    if padded:
        for row, n in zip(x, rng.integers(0, steps + 1, batch)):  # some rows fully padded
            row[n:] = 0
    return x


def token_model(rng, *body, steps=None, mask_zero=True, dim=16):
    inputs = attnx.Input((steps,), dtype="int64")
    x = layers.Embedding(50, dim, mask_zero=mask_zero)(inputs)
    for layer in body:
        x = layer(x)
    return attnx.Model(inputs, x)


def float_model(shape, *body):
    inputs = attnx.Input(shape)
    x = inputs
    for layer in body:
        x = layer(x)
    return attnx.Model(inputs, x)


# One model per layer class the plan lowers (the contract below fails when a lowering has none), each with the
# inputs to try: random batch sizes and lengths, masks from Embedding(mask_zero=True) with padded rows.
def _cases():
    return {
        layers.Embedding: lambda rng, T: (token_model(rng, layers.Dense(3), steps=T), ids(rng, 4, T)),
        layers.Dense: lambda rng, T: (float_model((T, 5), layers.Dense(7, activation="relu"),
                                                  layers.Dense(3, activation="softmax", use_bias=False)),
                                      rng.normal(size=(3, T, 5)).astype(np.float32)),
        layers.Activation: lambda rng, T: (float_model((T, 6), layers.Activation("tanh"), layers.Activation("softmax")),
                                           rng.normal(size=(2, T, 6)).astype(np.float32)),
        layers.Dropout: lambda rng, T: (float_model((6,), layers.Dropout(0.5), layers.Dense(2)),
                                        rng.normal(size=(5, 6)).astype(np.float32)),
        layers.SpatialDropout1D: lambda rng, T: (float_model((T, 6), layers.SpatialDropout1D(0.3), layers.Dense(2)),
                                                 rng.normal(size=(5, T, 6)).astype(np.float32)),
        layers.LSTM: lambda rng, T: (token_model(rng, layers.LSTM(9, return_sequences=True, zero_output_for_mask=True),
                                                 layers.LSTM(5, num_layers=2)), ids(rng, 5, T)),
        layers.GRU: lambda rng, T: (token_model(rng, layers.GRU(8, go_backwards=True), mask_zero=False),
                                    ids(rng, 3, T, padded=False)),
        layers.SimpleRNN: lambda rng, T: (float_model((T, 4), layers.SimpleRNN(6, return_sequences=True),
                                                      layers.GRU(4, reset_after=False, activation="relu")),
                                          rng.normal(size=(2, T, 4)).astype(np.float32)),
        layers.Bidirectional: lambda rng, T: (token_model(
            rng, layers.Bidirectional(layers.GRU(6, return_sequences=True, num_layers=2)),
            layers.Bidirectional(layers.LSTM(5), merge_mode="ave")), ids(rng, 4, T)),
        layers.AttentionPooling: lambda rng, T: (token_model(
            rng, layers.LSTM(8, return_sequences=True, zero_output_for_mask=True), layers.AttentionPooling(),
            layers.Dense(1, activation="sigmoid"), steps=T), ids(rng, 6, T)),
        layers.PositionalEncoding: lambda rng, T: (token_model(rng, layers.PositionalEncoding(),
                                                               layers.GlobalAveragePooling1D()), ids(rng, 3, T)),
        layers.PositionEmbedding: lambda rng, T: (token_model(rng, layers.PositionEmbedding(40), layers.Dense(2)),
                                                  ids(rng, 2, T)),
        layers.LayerNormalization: lambda rng, T: (float_model((T, 8), layers.LayerNormalization(),
                                                               layers.LayerNormalization(center=False)),
                                                   rng.normal(size=(3, T, 8)).astype(np.float32)),
        layers.FeedForward: lambda rng, T: (float_model((T, 8), layers.FeedForward(16, activation="gelu")),
                                            rng.normal(size=(2, T, 8)).astype(np.float32)),
        layers.TransformerEncoderLayer: lambda rng, T: (token_model(
            rng, layers.PositionalEncoding(), layers.TransformerEncoderLayer(2, 12, norm_first=True),
            layers.GlobalAveragePooling1D()), ids(rng, 4, T)),
        layers.TransformerEncoder: lambda rng, T: (token_model(
            rng, layers.TransformerEncoder(2, num_heads=4, intermediate_dim=32),
            layers.GlobalAveragePooling1D(), layers.Dense(2, activation="softmax")), ids(rng, 5, T)),
        layers.GlobalAveragePooling1D: lambda rng, T: (float_model((T, 5), layers.GlobalAveragePooling1D()),
                                                       rng.normal(size=(4, T, 5)).astype(np.float32)),
    }


def test_every_lowered_layer_class_has_a_case():
    assert set(_cases()) == set(plan.LOWERINGS)


@pytest.mark.parametrize("cls", list(_cases()), ids=lambda c: c.__name__)
@pytest.mark.parametrize("seed", RNG_SEEDS)
def test_plan_output_equals_eager_output(cls, seed):
    rng = np.random.default_rng(seed)
    attnx.set_random_seed(seed)
    steps = int(rng.integers(1, 9))
    model, x = _cases()[cls](rng, steps)
    planned = plan.run(model, x)
    assert planned is not None, f"{cls.__name__}: the plan declined"
    expected = eager(model, x)
    np.testing.assert_allclose(planned, expected, rtol=2e-5, atol=2e-6)
    for call in (model, model.predict_on_batch, model.predict):
        np.testing.assert_allclose(call(x), expected, rtol=2e-5, atol=2e-6)
    batch = x[:1]  # another signature: a plan of its own
    np.testing.assert_allclose(model(batch), eager(model, batch), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("make", [lambda: layers.LSTM(48, return_sequences=True, zero_output_for_mask=True),
                                  lambda: layers.GRU(64, reset_after=False), lambda: layers.SimpleRNN(200),
                                  lambda: layers.Bidirectional(layers.GRU(40))], ids=["LSTM", "GRU", "SimpleRNN",
                                                                                      "Bidirectional"])
def test_recurrent_layers_past_the_size_that_projects_inputs_first(make):
    # (B, T, gates * units) beyond plan.hpp's kProjectFirstBytes: the steps fuse x_t W (rnn_forward); the
    # Dense keeps the layer off the embedding's table
    rng = np.random.default_rng(7)
    model = token_model(rng, layers.Dense(16), make(), steps=30)
    x = ids(rng, 40, 30)
    planned = plan.run(model, x)
    assert planned is not None
    np.testing.assert_allclose(planned, eager(model, x), rtol=2e-5, atol=2e-6)


def sentiment_model():
    return attnx.Sequential([layers.Embedding(500, 32, input_shape=(32,)), layers.LSTM(100, dropout=0.2,
                                                                                      return_sequences=True),
                             layers.AttentionPooling(), layers.Dense(1, activation="sigmoid")])


def transformer_classifier():
    inputs = attnx.Input((None,), dtype="int64")
    x = layers.PositionalEncoding()(layers.Embedding(500, 64, mask_zero=True)(inputs))
    x = layers.TransformerEncoder(2, num_heads=4, intermediate_dim=128)(x)
    return attnx.Model(inputs, layers.Dense(2, activation="softmax")(layers.GlobalAveragePooling1D()(x)))


@pytest.mark.parametrize("make", [sentiment_model, transformer_classifier])
def test_the_built_in_models_run_their_plan(make):
    rng = np.random.default_rng(0)
    model = make()
    for batch in (1, 7, 32):
        x = ids(rng, batch, 32, 500)
        assert plan.run(model, x) is not None
        np.testing.assert_allclose(model.predict(x), eager(model, x), rtol=2e-5, atol=2e-6)
    x = ids(rng, 70, 32, 500)  # several batches: the adapter cuts them, each batch planned
    np.testing.assert_allclose(model.predict(x, batch_size=32), eager(model, x), rtol=2e-5, atol=2e-6)


def test_weights_changed_by_fit_set_weights_and_quantize_are_seen():
    rng = np.random.default_rng(1)
    model = sentiment_model()
    model.compile("adam", "binary_crossentropy")
    x, y = ids(rng, 16, 32, 500), rng.integers(0, 2, (16, 1)).astype(np.float32)
    before = model.predict(x)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    after = model.predict(x)
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, eager(model, x), rtol=2e-5, atol=2e-6)
    one = x[:1]  # batch 1 reads the recurrent kernel in place, more rows pack it per call: both see new weights
    planned_one = model(one)
    model.set_weights([w * 0.5 for w in model.get_weights()])
    np.testing.assert_allclose(model(x), eager(model, x), rtol=2e-5, atol=2e-6)
    assert not np.allclose(model(one), planned_one)
    np.testing.assert_allclose(model(one), eager(model, one), rtol=2e-5, atol=2e-6)
    model.quantize("int8")  # int8 arrays replace the float kernels: the plan is rebuilt on the int8 kernels
    assert plan.run(model, x) is not None
    np.testing.assert_array_equal(model.predict(x), eager(model, x))


def _fallback_cases():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 6, 4)).astype(np.float32)
    with_conv = float_model((6, 4), layers.Conv1D(3, 2), layers.Dense(2))  # no lowering
    stateful = float_model((6, 4), layers.LSTM(3, stateful=True))
    carried = token_model(rng, layers.LSTM(3, return_sequences=True))  # padded steps carry the last output
    with _global_policy("mixed_bfloat16"):
        bf16 = float_model((6, 4), layers.Dense(5), layers.Dense(2))
    return [("a layer without a lowering", with_conv, x), ("a stateful layer", stateful, x),
            ("a carried mask", carried, ids(rng, 3, 6)), ("a bfloat16 policy", bf16, x)]


class _global_policy:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.old = attnx.mixed_precision.global_policy().name
        attnx.mixed_precision.set_global_policy(self.name)

    def __exit__(self, *exc):
        attnx.mixed_precision.set_global_policy(self.old)


@pytest.mark.parametrize("case", range(4))
def test_models_the_plan_does_not_hold_run_the_eager_path(case):
    what, model, x = _fallback_cases()[case]
    model(x)  # builds the layers
    assert plan.run(model, x) is None, what
    if what != "a stateful layer":  # (whose outputs depend on the calls before)
        np.testing.assert_array_equal(model.predict_on_batch(x), eager(model, x))


def test_a_given_mask_and_a_training_call_take_the_eager_path(monkeypatch):
    rng = np.random.default_rng(3)
    model = token_model(rng, layers.Dropout(0.5), layers.LSTM(4), layers.Dense(1), steps=5)
    x = ids(rng, 4, 5)
    calls = []
    monkeypatch.setattr(plan, "run", lambda *a: calls.append(a))
    mask = x != 0
    np.testing.assert_allclose(model(x, mask=mask), model._run_graph(x, False, mask)[0], rtol=1e-6)
    attnx.set_random_seed(5)
    trained = model(x, training=True)
    assert not calls
    attnx.set_random_seed(5)
    np.testing.assert_array_equal(trained, model._run_graph(x, True, None)[0])


def test_predict_of_one_batch_takes_no_data_adapter(monkeypatch):
    rng = np.random.default_rng(4)
    model = sentiment_model()
    x = ids(rng, 8, 32, 500)
    expected = eager(model, x)

    def refuse(*args, **kwargs):
        raise AssertionError("predict of one batch made a DataAdapter")
    monkeypatch.setattr(data_adapter, "DataAdapter", refuse)
    np.testing.assert_allclose(model.predict(x), expected, rtol=2e-5, atol=2e-6)
    with pytest.raises(AssertionError, match="DataAdapter"):
        model.predict(x, batch_size=4)  # several batches: the adapter


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test compares whatever each path raises
        return type(e), str(e)
    return None


@pytest.mark.parametrize("bad", ["rank", "rank of ids", "features", "dtype", "token id", "negative id", "float ids"])
def test_bad_input_raises_the_eager_error(bad):
    rng = np.random.default_rng(5)
    tokens = transformer_classifier()
    floats = float_model((6, 4), layers.LSTM(3), layers.Dense(2))
    model, x = {
        "rank": (tokens, ids(rng, 2, 5, 500)[:, :, None]),
        "rank of ids": (attnx.Sequential([layers.Embedding(500, 4, input_shape=(5,)), layers.Dense(2)]),
                        ids(rng, 2, 5, 500)[:, :, None]),
        "features": (floats, rng.normal(size=(2, 6, 5)).astype(np.float32)),
        "dtype": (floats, np.full((2, 6, 4), "a")),
        "token id": (tokens, np.array([[1, 2, 500]])),
        "negative id": (tokens, np.array([[1, -2, 3]])),
        "float ids": (tokens, np.array([[1.5, 2.0]])),
    }[bad]
    expected = _error(lambda: eager(model, x))
    assert expected is not None
    for call in (model, model.predict_on_batch, model.predict):
        assert _error(lambda: call(x)) == expected, call
    good = ids(rng, 1, 5, 500) if x.dtype.kind in "iuf" and model is not floats else \
        rng.normal(size=(1, 6, 4)).astype(np.float32)
    np.testing.assert_allclose(model(good), eager(model, good), rtol=2e-5, atol=2e-6)  # still planned after


def test_the_plan_checks_what_it_is_given():
    p = attnx.kernels.inference_plan(input_shape=[2, 3], token_ids=False)
    out = p.add_slot(size=8)
    with pytest.raises(ValueError, match="slot"):
        p.dense(out=out, in_=0, kernel=np.zeros((3, 5), np.float32), bias=None, activation="linear", rows=2)
    with pytest.raises(TypeError, match="float32"):
        p.dense(out=out, in_=0, kernel=np.zeros((3, 4)), bias=None, activation="linear", rows=2)
    with pytest.raises(ValueError, match="read-only input"):
        p.dense(out=0, in_=0, kernel=np.zeros((3, 3), np.float32), bias=None, activation="linear", rows=2)
    p.dense(out=out, in_=0, kernel=np.ones((3, 4), np.float32), bias=None, activation="linear", rows=2)
    with pytest.raises(ValueError, match="shape"):
        p.run(x=np.zeros((3, 3), np.float32), result=out, shape=[2, 4])
    with pytest.raises(TypeError, match="float32"):
        p.run(x=np.zeros((2, 3)), result=out, shape=[2, 4])
    np.testing.assert_array_equal(p.run(x=np.ones((2, 3), np.float32), result=out, shape=[2, 4]), np.full((2, 4), 3))


def test_threads_share_a_plan():
    import concurrent.futures
    rng = np.random.default_rng(6)
    model = transformer_classifier()
    xs = [ids(rng, 4, 16, 500) for _ in range(8)]
    expected = [eager(model, x) for x in xs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(model.predict_on_batch, xs * 3))
    for got, want in zip(results, expected * 3):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_copied_model_plans_with_its_own_weights():
    import copy
    rng = np.random.default_rng(8)
    model = sentiment_model()
    x = ids(rng, 2, 32, 500)
    model(x)
    for twin in (copy.deepcopy(model),):
        twin.set_weights([w + 0.1 for w in twin.get_weights()])
        np.testing.assert_allclose(twin(x), eager(twin, x), rtol=2e-5, atol=2e-6)
        assert not np.allclose(twin(x), model(x))
    np.testing.assert_allclose(model(x), eager(model, x), rtol=2e-5, atol=2e-6)


class _Recorded:
    """A plan that records the ops its builder adds (name, keyword arguments) and adds them."""

    def __init__(self, plan_, calls):
        self._plan, self._calls = plan_, calls

    def __getattr__(self, name):
        method = getattr(self._plan, name)

        def record(**kwargs):
            self._calls.append((name, kwargs))
            return method(**kwargs)
        return record


def _ops(monkeypatch, model, x):
    """The ops the plan of model for x adds, run once against the eager outputs."""
    calls = []
    make = plan.kernels.inference_plan
    monkeypatch.setattr(plan.kernels, "inference_plan", lambda **kw: _Recorded(make(**kw), calls))
    planned = plan.run(model, x)
    assert planned is not None
    np.testing.assert_allclose(planned, eager(model, x), rtol=2e-5, atol=2e-6)
    monkeypatch.undo()
    return calls


def _table_reads(calls):
    """(ops gathering embedding rows, rnn ops over an embedding's table, rnn ops over a slot)"""
    rnns = [kw for name, kw in calls if name == "rnn"]
    return (sum(name == "embedding" for name, _ in calls), sum(kw["embedding"] is not None for kw in rnns),
            sum(kw["embedding"] is None for kw in rnns))


# Every recurrent layer right after an Embedding (Dropout between: the identity at inference) projects its
# first level's inputs through a table of the embedding's rows: no embedding op, each direction its table
TABLE_CASES = {
    "LSTM": (lambda: [layers.LSTM(12)], 1),
    "LSTM sequences, masked": (lambda: [layers.LSTM(9, return_sequences=True, zero_output_for_mask=True),
                                        layers.GlobalAveragePooling1D()], 1),
    "GRU reset_after": (lambda: [layers.GRU(10, go_backwards=True)], 1),
    "GRU classic": (lambda: [layers.GRU(7, reset_after=False, return_sequences=True, zero_output_for_mask=True)], 1),
    "SimpleRNN relu": (lambda: [layers.SimpleRNN(11, activation="relu")], 1),
    "stacked LSTM": (lambda: [layers.LSTM(8, num_layers=3)], 1),
    "Bidirectional GRU, stacked": (lambda: [layers.Bidirectional(layers.GRU(6, num_layers=2))], 2),
    "Bidirectional LSTM sum": (lambda: [layers.Bidirectional(layers.LSTM(5, return_sequences=True),
                                                             merge_mode="sum"), layers.LSTM(4)], 2),
    "Dropout between": (lambda: [layers.Dropout(0.5), layers.SpatialDropout1D(0.2), layers.LSTM(6)], 1),
}


@pytest.mark.parametrize("case", list(TABLE_CASES))
@pytest.mark.parametrize("mask_zero", [False, True])
@pytest.mark.parametrize("batch", [1, 3, 24])
def test_recurrent_layers_over_an_embedding_take_its_table(case, mask_zero, batch, monkeypatch):
    rng = np.random.default_rng(batch)
    make, directions = TABLE_CASES[case]
    model = token_model(rng, *make(), steps=30, mask_zero=mask_zero)
    x = ids(rng, batch, 30, padded=mask_zero)
    gathers, over_table, over_slot = _table_reads(_ops(monkeypatch, model, x))
    assert (gathers, over_table) == (0, directions)
    for call in (model, model.predict_on_batch, model.predict):
        np.testing.assert_allclose(call(x), eager(model, x), rtol=2e-5, atol=2e-6)


def test_layers_that_read_the_embedding_rows_gather_them(monkeypatch):
    rng = np.random.default_rng(11)
    x = ids(rng, 4, 7, padded=False)
    between = token_model(rng, layers.Dense(8), layers.LSTM(5), steps=7, mask_zero=False)  # a layer between
    dense = token_model(rng, layers.Dense(3), steps=7, mask_zero=False)
    for model, want in ((between, (1, 0, 1)), (dense, (1, 0, 0))):
        assert _table_reads(_ops(monkeypatch, model, x)) == want
    alone = token_model(rng, steps=7, mask_zero=False)  # the embedding is the model's output
    assert _table_reads(_ops(monkeypatch, alone, x)) == (1, 0, 0)


def test_a_table_past_the_memory_cap_gathers_the_rows(monkeypatch):
    rng = np.random.default_rng(12)
    model = token_model(rng, layers.Bidirectional(layers.LSTM(8)), steps=6)
    x = ids(rng, 3, 6)
    monkeypatch.setattr(plan, "EMBEDDED_PROJECTION_BYTES", 2 * 50 * 32 * 4 - 1)  # two tables of 50 x 4 * 8
    assert _table_reads(_ops(monkeypatch, model, x)) == (1, 0, 2)
    monkeypatch.setattr(plan, "EMBEDDED_PROJECTION_BYTES", 2 * 50 * 32 * 4)
    model._inference_plans.clear()
    assert _table_reads(_ops(monkeypatch, model, x)) == (0, 2, 0)


def test_more_rows_than_a_call_gathers_from_the_table_take_the_fused_product(monkeypatch):
    rng = np.random.default_rng(14)
    model = token_model(rng, layers.LSTM(8), steps=6)
    x = ids(rng, 3, 6)
    monkeypatch.setattr(plan, "EMBEDDED_GATHER_BYTES", 3 * 6 * 32 * 4 - 1)  # (B, T, 4 * 8) floats
    assert _table_reads(_ops(monkeypatch, model, x)) == (1, 0, 1)
    monkeypatch.setattr(plan, "EMBEDDED_GATHER_BYTES", 3 * 6 * 32 * 4)
    model._inference_plans.clear()
    assert _table_reads(_ops(monkeypatch, model, x)) == (0, 1, 0)


def test_an_id_outside_the_table_raises_the_eager_error():
    rng = np.random.default_rng(13)
    model = attnx.Sequential([layers.Embedding(50, 8, input_shape=(5,)), layers.LSTM(4)])
    good = ids(rng, 2, 5, padded=False)
    np.testing.assert_allclose(model(good), eager(model, good), rtol=2e-5, atol=2e-6)
    for bad in (np.array([[1, 2, 50, 3, 4]]), np.array([[1, -1, 2, 3, 4]])):
        expected = _error(lambda: eager(model, bad))
        assert expected is not None
        assert _error(lambda: model(bad)) == expected
    np.testing.assert_allclose(model(good), eager(model, good), rtol=2e-5, atol=2e-6)


def test_the_plan_checks_an_rnn_over_an_embedding():
    rnn = dict(cell="lstm", kernel=np.zeros((4, 12), np.float32), recurrent_kernel=np.zeros((3, 12), np.float32),
               bias=None, recurrent_bias=None, mask=-1, reverse=False, reset_after=True, activation="tanh",
               recurrent_activation="sigmoid", batch=2, steps=5, return_sequences=False)
    floats = attnx.kernels.inference_plan(input_shape=[2, 5, 4], token_ids=False)
    with pytest.raises(ValueError, match="token ids"):
        floats.rnn(out=floats.add_slot(size=6), in_=0, embedding=np.zeros((9, 4), np.float32), **rnn)
    tokens = attnx.kernels.inference_plan(input_shape=[2, 5], token_ids=True)
    out = tokens.add_slot(size=6)
    with pytest.raises(ValueError, match="embedding"):
        tokens.rnn(out=out, in_=0, embedding=np.zeros((9, 5), np.float32), **rnn)  # 5 features, the kernel's 4
    with pytest.raises(TypeError, match="float32"):
        tokens.rnn(out=out, in_=0, embedding=np.zeros((9, 4)), **rnn)
    tokens.rnn(out=out, in_=0, embedding=np.zeros((9, 4), np.float32), **rnn)
    assert tokens.run(x=np.full((2, 5), 9), result=out, shape=[2, 3]) is None  # id 9 outside the table
    np.testing.assert_array_equal(tokens.run(x=np.full((2, 5), 8), result=out, shape=[2, 3]), np.zeros((2, 3)))
