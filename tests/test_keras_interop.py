"""Keras 3 models in and out (`attnx.interop.from_keras` / `to_keras`): models built and saved by
Keras (PyTorch backend) load into attnx with the same predictions, attnx models written with
`to_keras` load in Keras with the same predictions, and bad files are clear errors."""
import json
import os
import zipfile

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported

import numpy as np
import pytest

import attnx
from attnx import layers
from attnx.interop import from_keras, keras_objects, to_keras

keras = pytest.importorskip("keras")
pytest.importorskip("h5py")
if keras.backend.backend() != "torch":
    pytest.skip("these tests run Keras on the PyTorch backend (KERAS_BACKEND=torch)", allow_module_level=True)
K = keras.ops
TOL = dict(rtol=1e-5, atol=1e-5)
MAXLEN, VOCAB = 12, 40


@keras.saving.register_keras_serializable(package="tutorial")
class attention(keras.layers.Layer):  # noqa: N801  (the tutorial's name)
    """The Keras sentiment tutorial's attention layer, as it is written there."""

    def __init__(self, bias_shape="column", **kwargs):
        super().__init__(**kwargs)
        self.bias_shape = bias_shape

    def build(self, input_shape):
        self.W = self.add_weight(name="att_weight", shape=(input_shape[-1], 1), initializer="normal")
        shape = (input_shape[1], 1) if self.bias_shape == "column" else (input_shape[1],)
        self.b = self.add_weight(name="att_bias", shape=shape, initializer="zeros")

    def call(self, x):
        b = self.b if self.bias_shape == "column" else K.expand_dims(self.b, -1)
        et = K.squeeze(K.tanh(K.dot(x, self.W) + b), axis=-1)
        at = K.expand_dims(K.softmax(et), axis=-1)
        return K.sum(x * at, axis=1)

    def get_config(self):
        return {**super().get_config(), "bias_shape": self.bias_shape}


def _randomize(model, seed=0):
    """Random weights everywhere (zeros-initialized biases would hide a mapping that drops them)."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(rng.normal(0, 0.4, size=tuple(w.shape)).astype("float32"))


def _ids(batch, seed, pad=True):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(batch, MAXLEN))
    if pad:  # post-padding of random lengths, as pad_sequences makes
        for row, n in zip(ids, rng.integers(3, MAXLEN + 1, size=batch)):
            row[n:] = 0
    return ids.astype("int32")


def _keras_predict(model, x):
    out = model.predict(x, verbose=0)
    return [np.asarray(o) for o in out] if isinstance(out, list) else np.asarray(out)


def _same_predictions(keras_model, attnx_model, inputs):
    for x in inputs:
        expected = _keras_predict(keras_model, x)
        got = attnx_model.predict(x, verbose=0)
        if isinstance(expected, list) or isinstance(got, list):
            for e, g in zip(expected, got):
                np.testing.assert_allclose(g, np.asarray(e), **TOL)
        else:
            np.testing.assert_allclose(got, expected, **TOL)


def _tutorial_model(mask_zero=False, bias_shape="column"):
    inputs = keras.Input((MAXLEN,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 8, mask_zero=mask_zero)(inputs)
    h = keras.layers.LSTM(6, return_sequences=True)(h)
    outputs = keras.layers.Dense(1, activation="sigmoid")(attention(bias_shape=bias_shape)(h))
    model = keras.Model(inputs, outputs)
    _randomize(model)
    return model


# ------------------------------------------------------------------------------ Keras -> attnx
@pytest.mark.parametrize("mask_zero, bias_shape", [(False, "column"), (False, "vector"), (True, "column")])
def test_seed_tutorial_model_loads(tmp_path, mask_zero, bias_shape):
    # with mask_zero, the tutorial layer (given no mask by Keras) reads the LSTM's outputs at the
    # padded steps: the last real step's output (Keras' zero_output_for_mask=False)
    keras_model = _tutorial_model(mask_zero, bias_shape)
    path = tmp_path / "tutorial.keras"
    keras_model.save(path)
    model = from_keras(path)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == ["Embedding", "LSTM", "AttentionPooling", "Dense"]
    pooling = model.layers[2]
    assert pooling.params["bias"].shape == (MAXLEN, 1) and not pooling.use_mask  # Keras gives the layer no mask
    _same_predictions(keras_model, model, [_ids(7, 1), _ids(1, 2), _ids(33, 3)])


@pytest.mark.parametrize("layer_class", ["SimpleRNN", "GRU", "LSTM"])
@pytest.mark.parametrize("go_backwards", [False, True])
def test_masked_steps_output_as_keras(tmp_path, layer_class, go_backwards):
    # a mask with holes anywhere: Keras carries the state and (zero_output_for_mask=False) the output
    x = np.random.default_rng(0).normal(size=(3, 7, 4)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0, 0, 0], [1, 0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1, 1]], bool)
    for zero_output in (False, True):
        keras_layer = getattr(keras.layers, layer_class)(5, return_sequences=True, go_backwards=go_backwards,
                                                         zero_output_for_mask=zero_output)
        inputs = keras.Input((7, 4))
        keras_model = keras.Model(inputs, keras_layer(inputs))
        _randomize(keras_model, 7)
        keras_model.save(tmp_path / "rnn.keras")
        layer = from_keras(tmp_path / "rnn.keras").layers[0]
        assert layer.zero_output_for_mask == zero_output
        np.testing.assert_allclose(layer(x, mask=mask), np.asarray(keras_layer(x, mask=mask).detach()), **TOL)


def test_weights_file_with_its_config(tmp_path):
    keras_model = _tutorial_model()
    keras_model.save_weights(tmp_path / "m.weights.h5")
    (tmp_path / "config.json").write_text(keras_model.to_json())
    for config in (tmp_path / "config.json", keras_model.to_json(), keras_model.get_config()):
        model = from_keras(tmp_path / "m.weights.h5", config=config)
        _same_predictions(keras_model, model, [_ids(5, 4)])


def test_reading_needs_neither_keras_nor_torch(tmp_path):
    import subprocess
    import sys

    keras_model = _tutorial_model()
    keras_model.save(tmp_path / "t.keras")
    x = _ids(4, 1)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "expected.npy", _keras_predict(keras_model, x))
    script = (
        "import sys; sys.modules['keras'] = None; sys.modules['torch'] = None  # importing them fails\n"
        "import numpy as np, attnx\n"
        f"model = attnx.interop.from_keras({str(tmp_path / 't.keras')!r})\n"
        f"got = model.predict(np.load({str(tmp_path / 'x.npy')!r}), verbose=0)\n"
        f"np.testing.assert_allclose(got, np.load({str(tmp_path / 'expected.npy')!r}), rtol=1e-5, atol=1e-5)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)


def test_loaded_model_trains_and_saves(tmp_path):
    keras_model = _tutorial_model()
    keras_model.save(tmp_path / "t.keras")
    model = from_keras(tmp_path / "t.keras")
    model.compile("adam", "binary_crossentropy")
    x = _ids(16, 5)
    model.fit(x, np.arange(16) % 2, epochs=1, verbose=0)
    model.save(tmp_path / "t.attnx")
    loaded = attnx.load_model(tmp_path / "t.attnx")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_recurrent_mix_loads(tmp_path):
    inputs = keras.Input((MAXLEN,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 6, mask_zero=True)(inputs)
    h = keras.layers.Bidirectional(keras.layers.GRU(5, return_sequences=True))(h)  # reset_after=True
    h = keras.layers.LSTM(4, return_sequences=True)(h)
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    last = keras.layers.GRU(3, reset_after=False)(h)
    last2 = keras.layers.SimpleRNN(3, go_backwards=True)(h)
    h = keras.layers.Concatenate()([pooled, last, last2])
    h = keras.layers.Dropout(0.3)(keras.layers.Activation("tanh")(h))
    outputs = keras.layers.Dense(3, activation="softmax")(h)
    keras_model = keras.Model(inputs, outputs)
    _randomize(keras_model, 1)
    keras_model.save(tmp_path / "rnn.keras")
    model = from_keras(tmp_path / "rnn.keras")
    gru = next(layer for layer in model.layers if type(layer).__name__ == "Bidirectional").forward_layer
    assert gru.reset_after
    _same_predictions(keras_model, model, [_ids(6, 6), _ids(2, 7)])


def test_masked_attention_model_loads(tmp_path):
    # Keras 3 records the mask's NotEqual and ConvertToTensor ops; attnx propagates the mask itself
    inputs = keras.Input((MAXLEN,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 6, mask_zero=True)(inputs)
    h = keras.layers.LSTM(4, return_sequences=True)(h)
    h = keras.layers.Attention(use_scale=True)([keras.layers.Dense(4)(h), h])
    keras_model = keras.Model(inputs, keras.layers.GlobalAveragePooling1D()(h))
    _randomize(keras_model, 5)
    keras_model.save(tmp_path / "masked.keras")
    model = from_keras(tmp_path / "masked.keras")
    _same_predictions(keras_model, model, [_ids(5, 10), _ids(2, 11)])


def test_time_distributed_and_spatial_dropout_load(tmp_path):
    keras_model = keras.Sequential([
        keras.Input((MAXLEN,), dtype="int32"),
        keras.layers.Embedding(VOCAB, 6),
        keras.layers.SpatialDropout1D(0.3),
        keras.layers.GRU(5, return_sequences=True),
        keras.layers.TimeDistributed(keras.layers.Dense(3, activation="relu")),
        keras.layers.TimeDistributed(keras.layers.LayerNormalization()),
    ])
    _randomize(keras_model, 8)
    keras_model.save(tmp_path / "td.keras")
    model = from_keras(tmp_path / "td.keras")
    assert [type(layer).__name__ for layer in model.layers][-2:] == ["Dense", "LayerNormalization"]
    _same_predictions(keras_model, model, [_ids(3, 9)])
    conv = keras.Sequential([keras.Input((MAXLEN, 4)), keras.layers.TimeDistributed(keras.layers.Reshape((2, 2)))])
    conv.save(tmp_path / "td_reshape.keras")
    with pytest.raises(ValueError, match="wraps a Reshape"):
        from_keras(tmp_path / "td_reshape.keras")


def test_sequential_stacked_and_bidirectional_lstm_loads(tmp_path):
    keras_model = keras.Sequential([
        keras.Input((MAXLEN,), dtype="int32"),
        keras.layers.Embedding(VOCAB, 6),
        keras.layers.Bidirectional(keras.layers.LSTM(4, return_sequences=True), merge_mode="sum"),
        keras.layers.LSTM(5, return_sequences=True),
        keras.layers.LSTM(5),
        keras.layers.Dense(2),
    ])
    _randomize(keras_model, 2)
    keras_model.save(tmp_path / "seq.keras")
    model = from_keras(tmp_path / "seq.keras")
    assert isinstance(model, attnx.Sequential)
    _same_predictions(keras_model, model, [_ids(4, 8, pad=False)])


def _two_input_keras_model():
    q, v = keras.Input((5, 8)), keras.Input((6, 8))
    a = keras.layers.MultiHeadAttention(2, 3, value_dim=4)(q, v)
    a = keras.layers.LayerNormalization(epsilon=1e-5)(a)
    dot = keras.layers.Attention(use_scale=True)([q, v])
    add = keras.layers.AdditiveAttention()([q, v])
    h = keras.layers.Concatenate()([a, dot, add])
    h = keras.layers.Add()([h, h])
    flat = keras.layers.Flatten()(keras.layers.Reshape((10, 12))(h))
    outputs = [keras.layers.Dense(2)(flat), keras.layers.GlobalAveragePooling1D()(h)]
    model = keras.Model([q, v], outputs)
    _randomize(model, 3)
    return model


def test_attention_and_transformer_layers_load(tmp_path):
    keras_model = _two_input_keras_model()
    keras_model.save(tmp_path / "att.keras")
    model = from_keras(tmp_path / "att.keras")
    rng = np.random.default_rng(9)
    batch = [rng.normal(size=(3, 5, 8)).astype("float32"), rng.normal(size=(3, 6, 8)).astype("float32")]
    _same_predictions(keras_model, model, [batch])


def test_keras_concat_score_loads(tmp_path):
    q, v = keras.Input((4, 6)), keras.Input((5, 6))
    keras_model = keras.Model([q, v], keras.layers.Attention(use_scale=True, score_mode="concat")([q, v]))
    _randomize(keras_model, 4)
    keras_model.save(tmp_path / "concat.keras")
    rng = np.random.default_rng(1)
    batch = [rng.normal(size=(2, 4, 6)).astype("float32"), rng.normal(size=(2, 5, 6)).astype("float32")]
    _same_predictions(keras_model, from_keras(tmp_path / "concat.keras"), [batch])


def _images(batch, seed, rows=13, cols=11, channels=3):
    return np.random.default_rng(seed).normal(size=(batch, rows, cols, channels)).astype("float32")


def _keras_cnn(pooling):
    """Conv2D -> MaxPooling2D -> Conv2D -> AveragePooling2D -> regions -> pooled -> Dense. Average pooling
    'same' is given pads even on each side: there Keras' torch backend excludes them as TensorFlow and
    attnx do (see test_keras_torch_average_pooling_with_odd_pads)."""
    inputs = keras.Input((13, 11, 3))
    x = keras.layers.Conv2D(6, 3, strides=2, padding="same", activation="relu")(inputs)  # 7 x 6
    x = keras.layers.MaxPooling2D(2, strides=1, padding="same")(x)
    x = keras.layers.Conv2D(8, (2, 3), activation="tanh", use_bias=False)(x)  # 6 x 4
    x = keras.layers.AveragePooling2D(3, strides=(1, 3), padding="same")(x)  # pads (1, 1) and (1, 1)
    x = keras.layers.Reshape((-1, 8))(x)
    x = attention()(x) if pooling == "attention" else keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(x))
    _randomize(model, 11)
    return model


@pytest.mark.parametrize("pooling", ["attention", "average"])
def test_keras_cnn_loads(tmp_path, pooling):
    keras_model = _keras_cnn(pooling)
    keras_model.save(tmp_path / "cnn.keras")
    model = from_keras(tmp_path / "cnn.keras")
    assert [type(layer).__name__ for layer in model.layers][:4] == ["Conv2D", "MaxPooling2D", "Conv2D",
                                                                    "AveragePooling2D"]
    assert model.layers[2].kernel_size == (2, 3) and not model.layers[2].use_bias
    _same_predictions(keras_model, model, [_images(5, 1), _images(1, 2)])


def _odd_same_pads(size, window, stride):
    """Whether TensorFlow's 'same' pads an odd number of pixels on this axis (one more at the end)."""
    return max((-(-size // stride) - 1) * stride + window - size, 0) % 2 == 1


@pytest.mark.parametrize("layer_class", ["Conv2D", "MaxPooling2D", "AveragePooling2D"])
@pytest.mark.parametrize("padding", ["valid", "same"])
def test_image_layers_of_random_geometries_load(tmp_path, layer_class, padding):
    rng = np.random.default_rng(len(layer_class) + len(padding))
    for case in range(4):
        window, strides = tuple(int(v) for v in rng.integers(1, 5, 2)), tuple(int(v) for v in rng.integers(1, 4, 2))
        rows, cols = (int(v) for v in rng.integers(5, 10, 2))
        while layer_class == "AveragePooling2D" and padding == "same" and (
                _odd_same_pads(rows, window[0], strides[0]) or _odd_same_pads(cols, window[1], strides[1])):
            # Keras' torch backend agrees on even pads only (test_keras_torch_average_pooling_with_odd_pads)
            window, strides = tuple(int(v) for v in rng.integers(1, 5, 2)), tuple(int(v) for v in rng.integers(1, 4, 2))
            rows, cols = (int(v) for v in rng.integers(5, 10, 2))
        options = dict(activation=str(rng.choice(["relu", "sigmoid", "softmax", "gelu"]))) \
            if layer_class == "Conv2D" else {}
        args = (int(rng.integers(1, 5)), window) if layer_class == "Conv2D" else (window,)
        keras_model = keras.Sequential([keras.Input((rows, cols, 3)),
                                        getattr(keras.layers, layer_class)(*args, strides=strides, padding=padding,
                                                                           **options)])
        _randomize(keras_model, case)
        keras_model.save(tmp_path / "layer.keras")
        _same_predictions(keras_model, from_keras(tmp_path / "layer.keras"), [_images(2, case, rows, cols)])


def test_keras_torch_average_pooling_with_odd_pads():
    """Keras 3's torch backend pads an odd 'same' total by repeating the edge pixels and counts them
    (3.15.1, keras/src/backend/torch/nn.py); TensorFlow's, JAX's and attnx's averages exclude padding.
    attnx keeps TensorFlow's rule, so such a layer agrees with Keras on those backends only."""
    x = _images(2, 0, 6, 6)
    keras_layer = keras.layers.AveragePooling2D(3, strides=2, padding="same")  # pads (0, 1) on each axis
    attnx_layer = layers.AveragePooling2D(3, strides=2, padding="same")
    expected = x[:, 4:, 4:].mean(axis=(1, 2))  # the last window: two real pixels each way
    np.testing.assert_allclose(attnx_layer(x)[:, 2, 2], expected, **TOL)
    keras_out = np.asarray(keras_layer(x).detach())
    if np.allclose(keras_out[:, 2, 2], expected, **TOL):
        pytest.skip("this Keras excludes the padding on the torch backend too")
    np.testing.assert_allclose(keras_out[:, :2, :2], attnx_layer(x)[:, :2, :2], **TOL)  # unpadded windows agree


# ------------------------------------------------------------------------------ attnx -> Keras
def _keras_load(path):
    return keras.saving.load_model(path, custom_objects=keras_objects())


def _randomize_attnx(model, seed=0):
    rng = np.random.default_rng(seed)
    for p in model.params.values():
        p[...] = rng.normal(0, 0.4, size=p.shape)


def test_seed_model_to_keras(tmp_path):
    model = attnx.Sequential([
        layers.Embedding(VOCAB, 8, input_shape=(MAXLEN,), embeddings_regularizer=attnx.regularizers.L2(1e-3),
                         trainable=False),  # frozen (pretrained) embeddings stay frozen both ways
        layers.LSTM(6, dropout=0.2, return_sequences=True),
        layers.AttentionPooling(),
        layers.Dense(1, activation="sigmoid"),
    ])
    _randomize_attnx(model)
    path = tmp_path / "seed.keras"
    to_keras(model, path)
    keras_model = _keras_load(path)
    assert not keras_model.get_layer(model.layers[0].name).trainable
    _same_predictions(keras_model, model, [_ids(5, 1), _ids(17, 2)])
    back = from_keras(path)
    assert not back.layers[0].trainable
    np.testing.assert_allclose(back.predict(_ids(5, 1), verbose=0), model.predict(_ids(5, 1), verbose=0), **TOL)


def test_masked_recurrent_model_to_keras(tmp_path):
    inputs = attnx.Input((MAXLEN,), dtype="int32")
    h = layers.Embedding(VOCAB, 6, mask_zero=True)(inputs)
    h = layers.Bidirectional(layers.GRU(4, return_sequences=True, num_layers=2))(h)
    h = layers.AttentionPooling(return_sequences=True)(h)
    h = layers.LSTM(5, num_layers=2, stack_dropout=0.1)(h)
    s = layers.GRU(3, reset_after=False)(layers.LayerNormalization()(layers.Embedding(VOCAB, 4)(inputs)))
    outputs = layers.Dense(2, activation="softmax")(layers.Concatenate()([h, s, layers.SimpleRNN(3)(
        layers.Dropout(0.2)(layers.Embedding(VOCAB, 4)(inputs)))]))
    model = attnx.Model(inputs, outputs)
    _randomize_attnx(model, 1)
    to_keras(model, tmp_path / "rnn.keras")
    _same_predictions(_keras_load(tmp_path / "rnn.keras"), model, [_ids(6, 3), _ids(3, 4)])


def test_attention_model_to_keras(tmp_path):
    q, v = attnx.Input((5, 8)), attnx.Input((6, 8))
    a = layers.MultiHeadAttention(2, 3, value_dim=4)(q, v)
    dot = layers.Attention(use_scale=True)([q, v])
    h = layers.Add()([layers.LayerNormalization()(a), dot])
    outputs = layers.Dense(3)(layers.Flatten()(layers.Reshape((8, 5))(layers.Activation("relu")(h))))
    model = attnx.Model([q, v], [outputs, layers.GlobalAveragePooling1D()(h)])
    _randomize_attnx(model, 2)
    keras_model = to_keras(model, tmp_path / "att.keras")
    rng = np.random.default_rng(3)
    batch = [rng.normal(size=(4, 5, 8)).astype("float32"), rng.normal(size=(4, 6, 8)).astype("float32")]
    _same_predictions(keras_model, model, [batch])
    _same_predictions(_keras_load(tmp_path / "att.keras"), model, [batch])


def _attnx_cnn(pooling):
    inputs = attnx.Input((13, 11, 3))
    x = layers.Conv2D(6, 3, strides=2, padding="same", activation="relu")(inputs)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = layers.Conv2D(8, (2, 2), activation="tanh", kernel_regularizer=attnx.regularizers.L2(1e-3))(x)  # 3 x 2
    x = layers.AveragePooling2D((1, 2))(x)
    x = layers.Reshape((-1, 8))(x)
    x = layers.AttentionPooling()(x) if pooling == "attention" else layers.GlobalAveragePooling1D()(x)
    model = attnx.Model(inputs, layers.Dense(4, activation="softmax")(x))
    _randomize_attnx(model, 4)
    return model


@pytest.mark.parametrize("pooling", ["attention", "average"])
def test_cnn_to_keras(tmp_path, pooling):
    model = _attnx_cnn(pooling)
    keras_model = to_keras(model, tmp_path / "cnn.keras")
    conv = keras_model.get_layer(model.layers[0].name)
    assert conv.strides == (2, 2) and conv.padding == "same" and conv.kernel.shape == (3, 3, 3, 6)
    batches = [_images(4, 5), _images(1, 6)]
    _same_predictions(keras_model, model, batches)
    _same_predictions(_keras_load(tmp_path / "cnn.keras"), model, batches)
    back = from_keras(tmp_path / "cnn.keras")
    np.testing.assert_allclose(back.predict(batches[0], verbose=0), model.predict(batches[0], verbose=0), **TOL)


# ------------------------------------------------------------------------------ bad input
def test_layer_attnx_lacks_is_named(tmp_path):
    keras_model = keras.Sequential([keras.Input((MAXLEN, 4)), keras.layers.UpSampling1D(2), keras.layers.Flatten()])
    keras_model.save(tmp_path / "conv.keras")
    with pytest.raises(ValueError, match="UpSampling1D"):  # (Conv1D, once missing, converts since issue 41)
        from_keras(tmp_path / "conv.keras")


def test_op_between_layers_is_named(tmp_path):
    inputs = keras.Input((4,))
    keras_model = keras.Model(inputs, keras.layers.Dense(2)(K.multiply(inputs, 2.0)))
    keras_model.save(tmp_path / "op.keras")
    with pytest.raises(ValueError, match="Keras op Multiply"):
        from_keras(tmp_path / "op.keras")


def test_custom_layer_attnx_lacks_is_named(tmp_path):
    @keras.saving.register_keras_serializable(package="tests")
    class Gate(keras.layers.Layer):
        def call(self, x):
            return x * 2

    keras_model = keras.Sequential([keras.Input((4,)), Gate()])
    keras_model.save(tmp_path / "gate.keras")
    with pytest.raises(ValueError, match="custom layer Gate"):
        from_keras(tmp_path / "gate.keras")


def test_tutorial_layer_under_another_name(tmp_path):
    @keras.saving.register_keras_serializable(package="tests")
    class WordAttention(attention):
        pass

    inputs = keras.Input((MAXLEN, 5))
    keras_model = keras.Model(inputs, WordAttention()(inputs))
    _randomize(keras_model, 6)
    keras_model.save(tmp_path / "named.keras")
    with pytest.raises(ValueError, match="custom layer WordAttention"):
        from_keras(tmp_path / "named.keras")
    model = from_keras(tmp_path / "named.keras", custom_objects={"WordAttention": layers.AttentionPooling})
    x = np.random.default_rng(0).normal(size=(3, MAXLEN, 5)).astype("float32")
    _same_predictions(keras_model, model, [x])


def test_truncated_and_corrupted_files(tmp_path):
    _tutorial_model().save(tmp_path / "good.keras")
    data = (tmp_path / "good.keras").read_bytes()
    for cut in (10, len(data) // 3, len(data) // 2, len(data) - 30):
        (tmp_path / "cut.keras").write_bytes(data[:cut])
        with pytest.raises(ValueError, match="cut.keras"):
            from_keras(tmp_path / "cut.keras")
    rng = np.random.default_rng(0)
    for seed in range(8):  # flipped bytes in the weights member (the config member: a JSON error)
        bad = bytearray(data)
        start = data.index(b"\x89HDF")
        for i in rng.integers(start, len(data) - 100, size=20):
            bad[i] ^= 0xFF
        (tmp_path / "flip.keras").write_bytes(bytes(bad))
        try:
            from_keras(tmp_path / "flip.keras")
        except ValueError as exc:
            assert "flip.keras" in str(exc)


def test_config_declaring_more_than_the_file_holds(tmp_path):
    _tutorial_model().save(tmp_path / "good.keras")
    with zipfile.ZipFile(tmp_path / "good.keras") as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    config = json.loads(members["config.json"])
    embedding = next(e for e in config["config"]["layers"] if e["class_name"] == "Embedding")
    embedding["config"]["input_dim"] = 10 ** 9
    members["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(tmp_path / "huge.keras", "w") as zf:
        for name, blob in members.items():
            zf.writestr(name, blob)
    with pytest.raises(ValueError, match="huge.keras"):
        from_keras(tmp_path / "huge.keras")


def test_weight_declaring_more_than_the_file_stores(tmp_path):
    # a dataset of a huge declared shape with no data behind it: refused before anything is read
    import h5py

    keras_model = _tutorial_model()
    keras_model.save_weights(tmp_path / "w.weights.h5")
    with h5py.File(tmp_path / "w.weights.h5", "r+") as h5:
        del h5["layers/embedding/vars/0"]
        h5.create_dataset("layers/embedding/vars/0", shape=(10 ** 7, 10 ** 3), dtype="float32")
    with pytest.raises(ValueError, match="declares shape"):
        from_keras(tmp_path / "w.weights.h5", config=keras_model.to_json())


def test_wrong_paths_and_arguments(tmp_path):
    with pytest.raises(FileNotFoundError):
        from_keras(tmp_path / "missing.keras")
    keras_model = _tutorial_model()
    keras_model.save_weights(tmp_path / "w.weights.h5")
    with pytest.raises(ValueError, match="config"):
        from_keras(tmp_path / "w.weights.h5")
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match="notes.txt"):
        from_keras(tmp_path / "notes.txt", config=keras_model.to_json())


def test_to_keras_names_a_layer_keras_lacks():
    model = attnx.Sequential([layers.Dense(4, input_shape=(5, 3)), layers.PositionalEncoding()])
    with pytest.raises(ValueError, match="PositionalEncoding"):
        to_keras(model)
    q, v = attnx.Input((2, 4)), attnx.Input((3, 4))
    with pytest.raises(ValueError, match="general"):
        to_keras(attnx.Model([q, v], layers.Attention(score="general")([q, v])))
    x, lengths = attnx.Input((3, 4)), attnx.Input((), dtype="int32")
    with pytest.raises(ValueError, match="lengths"):
        to_keras(attnx.Model([x, lengths], layers.LSTM(2)(x, lengths=lengths)))


CHANNELS_FIRST = "data_format='channels_first'"


@pytest.mark.parametrize("layer, option", [
    (lambda: keras.layers.Conv2D(4, 3, dilation_rate=2, name="dilated"), "dilation_rate=\\(2, 2\\)"),
    (lambda: keras.layers.Conv2D(6, 3, groups=3, name="grouped"), "groups=3"),
    (lambda: keras.layers.Conv2D(4, 3, data_format="channels_first", name="first"), CHANNELS_FIRST),
    (lambda: keras.layers.MaxPooling2D(2, data_format="channels_first", name="first"), CHANNELS_FIRST),
    (lambda: keras.layers.AveragePooling2D(2, data_format="channels_first", name="first"), CHANNELS_FIRST),
])
def test_image_options_attnx_lacks_are_named(tmp_path, layer, option):
    keras_layer = layer()
    keras_model = keras.Sequential([keras.Input((6, 6, 3)), keras_layer])
    keras_model.save(tmp_path / "option.keras")
    named = f"option.keras: {type(keras_layer).__name__} '{keras_layer.name}' has {option}"
    with pytest.raises(ValueError, match=named):
        from_keras(tmp_path / "option.keras")
