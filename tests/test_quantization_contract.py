"""int8 as a contract over every model class that saves: float32 and int8 models save and load to
identical predictions, or `quantize` says clearly why it cannot (and changes nothing); int8 weights
are checked wherever they enter (set_weights, load_model, load_weights); and the stated error bound
(`attnx.quantization.dense_error_bound`, docs/guides/int8.md) holds for every quantizable layer on
adversarial inputs: one large input feature the output does not use, and sums that cancel."""
import numpy as np
import pytest

import attnx
from attnx import layers, quantization
from attnx.draw import DRAW
from attnx.hierarchical import HierarchicalAttentionNetwork
from attnx.seq2seq import Seq2Seq, Transformer
from attnx.vision import ImageCaptioner


class ProjectThenPool(layers.Layer):
    """A `call` layer holding a Dense (and a list of them)."""

    def __init__(self, units=5, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.projection = layers.Dense(units, activation="tanh")
        self.heads = [layers.Dense(3), layers.Dense(3)]

    def call(self, inputs):
        h = self.projection(inputs)
        return attnx.ops.mean(self.heads[0](h) + self.heads[1](h), axis=1)


class TwoTowers(attnx.Model):
    """A model written as a class with sublayers (attributes, a list, a Bidirectional)."""

    def __init__(self, vocab=30, **kwargs):
        super().__init__(**kwargs)
        self.vocab = vocab
        self.embedding = layers.Embedding(vocab, 6)
        self.towers = [layers.Bidirectional(layers.GRU(4, return_sequences=True)), layers.LSTM(5)]
        self.head = layers.Dense(2)

    def call(self, ids):
        return self.head(self.towers[1](self.towers[0](self.embedding(ids))))


def _ids(rng, shape, vocab):
    ids = rng.integers(3, vocab, shape)
    ids[0, -2:] = 0
    return ids


def _sequential(rng):
    model = attnx.Sequential([layers.Embedding(40, 8, mask_zero=True), layers.LSTM(6, return_sequences=True),
                              layers.GRU(5), layers.Dense(3, activation="softmax")])
    x = _ids(rng, (4, 7), 40)
    model.predict(x, verbose=0)
    return model, x


def _functional(rng):
    inp = attnx.Input((7,), dtype="int64")
    h = layers.Embedding(40, 8, mask_zero=True)(inp)
    h = layers.Bidirectional(layers.SimpleRNN(6, return_sequences=True, num_layers=2))(h)
    h = ProjectThenPool()(h)
    return attnx.Model(inp, layers.Dense(1, activation="sigmoid")(h)), _ids(rng, (4, 7), 40)


def _call_layer(rng):
    model = attnx.Sequential([layers.Dense(6, input_shape=(5, 4)), ProjectThenPool(4), layers.Dense(2)])
    return model, rng.normal(size=(3, 5, 4)).astype(np.float32)


def _subclassed(rng):
    model = TwoTowers()
    x = _ids(rng, (3, 6), 30)
    model(x)
    return model, x


def _seq2seq(rng):
    model = Seq2Seq(13, 13, embedding_dim=8, units=8, attention="luong", score="general", cell="lstm",
                    bidirectional=True, start_token=1, end_token=2, max_length=6)
    model.build()
    return model, [_ids(rng, (3, 5), 13), _ids(rng, (3, 4), 13)]


def _transformer(rng, **options):
    model = Transformer(11, 13, model_dim=8, num_heads=2, intermediate_dim=16, num_encoder_layers=1,
                        num_decoder_layers=1, start_token=1, end_token=2, max_length=6, **options)
    model.build()
    return model, [_ids(rng, (3, 5), 11), _ids(rng, (3, 4), 13)]


def _han(rng):
    model = HierarchicalAttentionNetwork(11, embedding_dim=4, word_units=3, sentence_units=2)
    x = _ids(rng, (3, 4, 5), 11)
    model(x)
    return model, x


def _draw(rng):
    model = DRAW(6, 7, read_n=2, write_n=3, steps=3, encoder_units=4, decoder_units=5, latent_dim=2)
    x = rng.random((2, 6, 7)).astype(np.float32)
    model(x)
    return model, x


def _captioner(rng):
    x = attnx.Input((5, 7))
    encoder = attnx.Model(x, layers.Dense(6, activation="tanh")(x))
    model = ImageCaptioner(encoder, (5, 7), vocab_size=9, embedding_dim=4, units=7, attention_units=5, max_length=6)
    model.build()
    return model, [rng.normal(size=(3, 5, 7)).astype(np.float32), _ids(rng, (3, 4), 9)]


def _lstmn(rng):
    model = attnx.Sequential([layers.Embedding(40, 8), layers.LSTMN(6), layers.Dense(2)])
    x = _ids(rng, (3, 6), 40)
    model.predict(x, verbose=0)
    return model, x


# (name, factory, what quantize says when it cannot: a piece of the error, or None: it quantizes)
MODELS = [
    ("Sequential", _sequential, None),
    ("functional", _functional, None),
    ("call layer holding Dense", _call_layer, None),
    ("subclassed with sublayers", _subclassed, None),
    ("Seq2Seq", _seq2seq, None),
    ("Transformer", _transformer, None),
    ("Transformer tie_output", lambda rng: _transformer(rng, tie_output=True), "tie_output=True"),
    ("HierarchicalAttentionNetwork", _han, None),
    ("DRAW", _draw, None),
    ("ImageCaptioner", _captioner, None),
    ("LSTMN model", _lstmn, "LSTMN"),
]


def _predict(model, x):
    out = model.apply(x, training=False)[0]
    return [np.asarray(o) for o in (out if isinstance(out, list) else [out])]


def _assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def _save_and_load(model, path):
    model.save(path)
    loaded = attnx.load_model(path)
    assert [(n, p.dtype, p.shape) for n, p in loaded.params.items()] == \
        [(n, p.dtype, p.shape) for n, p in model.params.items()]
    for p, q in zip(model.params.values(), loaded.params.values()):
        np.testing.assert_array_equal(p, q)
    return loaded


@pytest.mark.parametrize("name,make,refusal", MODELS, ids=[m[0] for m in MODELS])
def test_every_model_class_saves_and_loads_float32_and_int8(rng, tmp_path, name, make, refusal):
    model, x = make(rng)
    want = _predict(model, x)
    _assert_same(_predict(_save_and_load(model, tmp_path / "float.attnx"), x), want)
    if refusal is not None:
        before = {n: p.copy() for n, p in model.params.items()}
        with pytest.raises(ValueError, match=f"cannot be quantized.*{refusal}|{refusal}.*cannot be quantized"):
            model.quantize("int8")
        assert model.quantization_mode is None
        assert {n: p.dtype for n, p in model.params.items()} == {n: p.dtype for n, p in before.items()}
        _assert_same(_predict(model, x), want)  # nothing was changed
        return
    assert model.quantize("int8") is model
    assert model.quantization_mode == "int8"
    int8 = [n for n, p in model.params.items() if p.dtype == np.int8]
    assert int8 and all(n + "_scale" in model.params for n in int8)
    got = _predict(model, x)
    assert not all(np.array_equal(g, w) for g, w in zip(got, want))  # the int8 path ran
    loaded = _save_and_load(model, tmp_path / "int8.attnx")
    assert loaded.quantization_mode == "int8"
    _assert_same(_predict(loaded, x), got)
    model.save_weights(tmp_path / "int8.weights")
    loaded.load_weights(tmp_path / "int8.weights")
    _assert_same(_predict(loaded, x), got)


def test_quantize_none_and_unknown_modes_are_refused(rng):
    model, x = _sequential(rng)
    with pytest.raises(ValueError, match=r"quantize\(None\) does not make a model float32 again"):
        model.quantize(None)
    with pytest.raises(ValueError, match="unknown quantization mode 'int4'"):
        model.quantize("int4")
    with pytest.raises(ValueError, match=r"quantize\(None\)"):
        model.layers[0].quantize(None)
    assert model.quantization_mode is None and all(p.dtype == np.float32 for p in model.params.values())


def test_a_lone_lstmn_says_it_cannot(rng):
    layer = layers.LSTMN(4)
    layer(rng.normal(size=(2, 3, 5)).astype(np.float32))
    with pytest.raises(ValueError, match=r"layer '.*' \(LSTMN\) cannot be quantized: .*no int8 form"):
        layer.quantize("int8")


def _quantized_sequential(rng, tmp_path):
    model, x = _sequential(rng)
    model.quantize("int8")
    path = tmp_path / "q.attnx"
    model.save(path)
    return model, x, path


def _rewrite(path, tmp_path, edit):
    """A copy of the model file with the weights changed by `edit(name, array) -> array`."""
    from attnx import saving
    header, weights = saving.read_model(path)
    model = attnx.load_model(path)
    arrays = {n: edit(n, np.array(w)) for n, w in weights}
    out = tmp_path / "edited.attnx"
    saving._write_archive(out, header, arrays, None)
    return out, model


@pytest.mark.parametrize("bad,match", [
    (lambda w: np.where(w == w.max(), 300, w).astype(np.int16), "is an int8 quantized weight; got dtype int16"),
    (lambda w: w.astype(np.float32), "is an int8 quantized weight; got dtype float32"),
    (lambda w: np.where(w == w.max(), -128, w).astype(np.int8), "holds -128"),
])
def test_loading_checks_int8_weights(rng, tmp_path, bad, match):
    model, x, path = _quantized_sequential(rng, tmp_path)
    target = next(n for n, p in model.params.items() if p.dtype == np.int8)
    edited, _ = _rewrite(path, tmp_path, lambda n, w: bad(w) if n == target else w)
    with pytest.raises(ValueError, match=f"weight '{target}' {match}"):
        attnx.load_model(edited)


@pytest.mark.parametrize("value", [-1.0, np.nan, np.inf])
def test_loading_checks_scales(rng, tmp_path, value):
    model, x, path = _quantized_sequential(rng, tmp_path)
    target = next(n for n in model.params if n.endswith("_scale"))
    edited, _ = _rewrite(path, tmp_path, lambda n, w: np.full_like(w, value) if n == target else w)
    with pytest.raises(ValueError, match=f"weight '{target}' is the scale of an int8 weight"):
        attnx.load_model(edited)


def test_set_weights_checks_int8_weights(rng):
    layer = layers.Dense(4)
    layer(rng.normal(size=(2, 3)).astype(np.float32))
    layer.quantize("int8")
    kernel, scale, bias = layer.get_weights()
    for bad, match in ((kernel.astype(np.int16) * 3, "got dtype int16"),
                       (kernel.astype(np.float32), "got dtype float32"), (np.full_like(kernel, -128), "holds -128")):
        with pytest.raises(ValueError, match=f"Layer '{layer.name}': weight 'kernel' .*{match}"):
            layer.set_weights([bad, scale, bias])
    with pytest.raises(ValueError, match="weight 'kernel_scale' is the scale of an int8 weight"):
        layer.set_weights([kernel, -scale, bias])
    layer.set_weights([kernel, scale, bias])  # its own weights are fine
    np.testing.assert_array_equal(layer.params["kernel"], kernel)


def test_minus_128_never_reaches_a_kernel(rng):
    layer = layers.Dense(4)
    x = rng.normal(size=(2, 3)).astype(np.float32)
    layer(x)
    layer.quantize("int8")
    layer.params["kernel"][0, 0] = -128  # written in place, past set_weights
    with pytest.raises(ValueError, match="int8 values must lie in \\[-127, 127\\], got -128"):
        layer(x)
    lstm = layers.LSTM(3)
    lstm(rng.normal(size=(2, 4, 3)).astype(np.float32))
    lstm.quantize("int8")
    lstm.params["recurrent_kernel"][1, 2] = -128
    with pytest.raises(ValueError, match=f"Layer '{lstm.name}': weight 'recurrent_kernel': .*int8 values must lie in"):
        lstm(rng.normal(size=(2, 4, 3)).astype(np.float32))


@pytest.mark.parametrize("make", [lambda: layers.Dense(4), lambda: layers.LSTM(3),
                                  lambda: layers.GRU(3, reset_after=False), lambda: layers.GRU(3),
                                  lambda: layers.SimpleRNN(3)])
def test_packed_kernels_follow_set_weights_and_refuse_stray_writes(rng, make):
    """The int8 kernels are packed once (attnx.quantization.packed): set_weights (and loading) must
    reach the products, and a write past it must fail instead of leaving the packed form stale."""
    layer = make()
    x = rng.normal(size=(2, 4, 3)).astype(np.float32)
    layer(x)
    layer.quantize("int8")
    before = layer(x)
    weights = layer.get_weights()
    name = next(n for n, p in layer.params.items() if p.dtype == np.int8)
    with pytest.raises(ValueError, match="read-only"):
        layer.params[name][0, 0] = 1
    doubled = [w * 2 if n.endswith("_scale") else w for n, w in zip(layer.params, weights)]
    layer.set_weights(doubled)
    after = layer(x)
    assert not np.allclose(after, before)
    fresh = make()
    fresh(x)
    fresh.quantize("int8")
    fresh.set_weights(doubled)
    np.testing.assert_array_equal(after, fresh(x))  # as if packed from these weights in the first place
    layer.set_weights(weights)
    np.testing.assert_array_equal(layer(x), before)


def test_quantized_models_do_not_export_or_convert(rng):
    pytest.importorskip("onnx")
    model, x = _sequential(rng)
    model.quantize("int8")
    from attnx import export
    with pytest.raises(export.UnsupportedLayerError, match="is quantized \\(int8\\); export the float32 model"):
        export.to_onnx(model, "unused.onnx")
    dense = layers.Dense(2)
    dense(np.zeros((1, 3), np.float32))
    dense.quantize("int8")
    with pytest.raises(ValueError, match="is quantized"):
        attnx.interop.to_torch(dense)


# ------------------------------------------------------------------------------------ error bound
def _adversarial_inputs(rng, rows, features):
    """Rows of three kinds: ordinary; one feature 1000x the others (the outlier the output ignores:
    the kernel's row for it is zeroed by the caller); and a row whose products cancel."""
    x = rng.normal(size=(rows, features)).astype(np.float32)
    x[1::3, 0] = 1000.0
    return x


def _cancelling_kernel(rng, features, units):
    """A kernel whose columns sum x . w to ~0 for x = 1 (pairs of equal and opposite weights), its
    first row zero (the outlier feature is unused)."""
    half = rng.normal(size=(features // 2, units)).astype(np.float32)
    w = np.concatenate([half, -half], axis=0)
    if len(w) < features:
        w = np.concatenate([w, np.zeros((features - len(w), units), np.float32)])
    w[0] = 0.0
    return w


def _bound_holds(got, want, bound, slack=1.0):
    excess = np.abs(got - want) - (slack * bound + 1e-5 * (1 + np.abs(want)))  # float32 rounding
    assert np.all(excess <= 0), f"error beyond the bound by {excess.max():.3g}"


@pytest.mark.parametrize("activation", ["linear", "relu", "tanh", "sigmoid", "softmax"])
def test_dense_bound_under_outliers_and_cancellation(rng, activation):
    K, N = 16, 6
    layer = layers.Dense(N, activation=activation)
    x = _adversarial_inputs(rng, 9, K)
    x[2::3] = 1.0  # the rows the cancelling kernel sums to 0
    layer(x)
    layer.set_weights([_cancelling_kernel(rng, K, N), rng.normal(size=N).astype(np.float32)])
    want = layer(x)
    bound = quantization.dense_error_bound(x, layer.params["kernel"])
    layer.quantize("int8")
    got = layer(x)
    # relu, tanh, sigmoid are 1-Lipschitz; softmax too in the max norm
    _bound_holds(got, want, bound.max(axis=1, keepdims=True) if activation == "softmax" else bound)
    outliers = np.abs(want[1::3]).max()
    assert np.abs(got[1::3] - want[1::3]).max() > 1e-3 * outliers  # the outlier rows do lose precision


def test_embedding_bound(rng):
    layer = layers.Embedding(20, 8)
    ids = np.arange(20)[None]
    layer(ids)
    table = rng.normal(size=(20, 8)).astype(np.float32)
    table[3, 0] = 1000.0  # an outlier entry: its row's other entries keep max / 254
    layer.set_weights([table])
    layer.quantize("int8")
    got = layer(ids)[0]
    _bound_holds(got, table, np.abs(table).max(axis=1, keepdims=True) / 254)


# one step from zero states: the input product's bound, through gates whose slopes are <= 1 (tanh,
# relu) and <= 1/4 (sigmoid): LSTM h moves by at most 1.5x the pre-activations' error, GRU 1.25x
RECURRENT = [
    ("SimpleRNN", lambda: layers.SimpleRNN(6), 1.0),
    ("GRU", lambda: layers.GRU(6), 1.25),
    ("GRU classic", lambda: layers.GRU(6, reset_after=False), 1.25),
    ("LSTM", lambda: layers.LSTM(6), 1.5),
    ("LSTM 2 levels", lambda: layers.LSTM(6, num_layers=2), None),
    ("Bidirectional LSTM", lambda: layers.Bidirectional(layers.LSTM(6)), 1.5),
    ("LSTMCell", lambda: layers.LSTMCell(6), 1.5),
    ("GRUCell", lambda: layers.GRUCell(6), 1.25),
]


@pytest.mark.parametrize("name,make,slope", RECURRENT, ids=[r[0] for r in RECURRENT])
def test_recurrent_bound_under_outliers_and_cancellation(rng, name, make, slope):
    K = 16
    layer = make()
    cell = isinstance(layer, (layers.LSTMCell, layers.GRUCell))
    x = _adversarial_inputs(rng, 9, K)
    x[2::3] = 1.0
    step = x if cell else x[:, None, :]
    layer(step)
    directions = [d for d, _ in layer.directions] if isinstance(layer, layers.Bidirectional) else [layer]
    bounds = []
    for d in directions:  # level 0's kernel: zero outlier row, cancelling columns
        kernel = _cancelling_kernel(rng, K, d.params["kernel"].shape[1])
        d.params["kernel"][...] = kernel
        bounds.append(quantization.dense_error_bound(x, kernel).max(axis=1, keepdims=True))
    want = layer(step)
    want = want[0] if cell and isinstance(want, list) else want
    layer.quantize("int8")
    got = layer(step)
    got = got[0] if cell and isinstance(got, list) else got
    if slope is None:  # level 1 reads level 0's outputs (ordinary inputs): the typical error only
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
        return
    bound = np.concatenate([b * np.ones((1, 6)) for b in bounds], axis=1) if len(bounds) > 1 else bounds[0]
    _bound_holds(got, want, bound, slack=slope)


def test_the_contract_covers_every_model_class_of_attnx(rng):
    """A model class added to attnx must join MODELS (this fails until it does)."""
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)
    ours = {cls for cls in subclasses(attnx.Model) if cls.__module__.startswith("attnx.")}
    covered = {type(make(rng)[0]) for _, make, _ in MODELS}
    assert ours <= covered, f"model classes without a case: {sorted(c.__name__ for c in ours - covered)}"
