"""ONNX export (`attnx.export`): every supported layer and several whole models, run in ONNX Runtime
on batches of other sizes and lengths than any the model saw, padding masks included, against
attnx's own `predict`; the exported Seq2Seq's greedy loop against `translate` / `greedy_decode`;
and the errors of bad input."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import attnx
from attnx import export, layers
from attnx.seq2seq import Seq2Seq

VOCAB = 23
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def session(path):
    onnx.checker.check_model(onnx.load(str(path)))
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def padded_ids(rng, batch, steps, padding="post"):
    """Token ids (B, T) in [1, VOCAB) with random lengths (0 and T included) padded with 0."""
    ids = rng.integers(1, VOCAB, (batch, steps))
    lengths = rng.integers(0, steps + 1, batch)
    lengths[:2] = [steps, 0][:batch]
    for row, n in zip(ids, lengths):
        if padding == "post":
            row[n:] = 0
        elif padding == "pre":
            row[:steps - n] = 0
        else:  # holes anywhere
            row[rng.random(steps) < 0.4] = 0
    return ids


def assert_exports_like_predict(model, batches, tmp_path):
    """Exports `model` and compares ONNX Runtime's outputs with `predict` on every batch."""
    path = export.to_onnx(model, tmp_path / "model.onnx")
    sess = session(path)
    names = [i.name for i in sess.get_inputs()]
    for batch in batches:
        arrays = batch if isinstance(batch, list) else [batch]
        got = sess.run(None, dict(zip(names, arrays)))
        want = model.predict(batch if len(arrays) > 1 else arrays[0], batch_size=len(arrays[0]))
        want = want if isinstance(want, list) else [want]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, **TOLERANCE)
    return sess


def token_model(*body, steps=None, mask_zero=True):
    """Input ids (B, steps) -> Embedding(VOCAB, 8) -> body."""
    inputs = attnx.Input((steps,), dtype="int64")
    x = layers.Embedding(VOCAB, 8, mask_zero=mask_zero)(inputs)
    for layer in body:
        x = layer(x)
    return attnx.Model(inputs, x)


def token_batches(rng, steps=(7, 11), sizes=(5, 2), padding="post"):
    return [padded_ids(rng, b, t, padding) for b, t in zip(sizes, steps)]


# ------------------------------------------------------------------ the seed sentiment model
def test_seed_sentiment_model(tmp_path, rng):
    """examples/sentiment.py's model: Embedding -> LSTM -> AttentionPooling -> Dense(sigmoid), unmasked as
    the tutorial and masked; the per-step bias fixes T = 32, the batch varies."""
    for mask_zero in (False, True):
        model = attnx.Sequential([
            layers.Embedding(VOCAB, 32, input_shape=(32,), mask_zero=mask_zero),
            layers.LSTM(100, dropout=0.2, return_sequences=True),
            layers.AttentionPooling(),
            layers.Dense(1, activation="sigmoid"),
        ])
        model.compile("adam", "binary_crossentropy")
        x = padded_ids(rng, 64, 32)
        model.fit(x, rng.integers(0, 2, 64).astype(np.float32), epochs=1, batch_size=32, verbose=0)
        assert_exports_like_predict(model, [padded_ids(rng, 7, 32), padded_ids(rng, 3, 32, "pre")], tmp_path)


def test_dynamic_steps_for_a_model_built_with_a_fixed_length(tmp_path, rng):
    model = attnx.Sequential([layers.Embedding(VOCAB, 8, input_shape=(10,), mask_zero=True), layers.GRU(6),
                              layers.Dense(2)])
    path = export.to_onnx(model, tmp_path / "fixed.onnx")
    assert [d.dim_value for d in onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim][1] == 10
    export.to_onnx(model, tmp_path / "model.onnx", dynamic_steps=True)
    sess = session(tmp_path / "model.onnx")
    for x in token_batches(rng, steps=(4, 17)):
        np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0], model.predict(x), **TOLERANCE)


# ------------------------------------------------------------------ recurrent layers
RECURRENT = {
    "simple_rnn": lambda: layers.SimpleRNN(6, return_sequences=True),
    "gru": lambda: layers.GRU(6, return_sequences=True),
    "gru_classic": lambda: layers.GRU(6, reset_after=False, return_sequences=True),
    "lstm_last": lambda: layers.LSTM(6),
    "lstm_relu": lambda: layers.LSTM(6, activation="relu", return_sequences=True),
    "lstm_linear": lambda: layers.LSTM(6, activation="linear", recurrent_activation="sigmoid"),
    "bi_rnn_linear": lambda: layers.Bidirectional(layers.SimpleRNN(5, activation="linear", return_sequences=True)),
    "lstm_no_bias": lambda: layers.LSTM(6, use_bias=False, return_sequences=True),
    "gru_go_backwards": lambda: layers.GRU(6, go_backwards=True, return_sequences=True),
    "lstm_stacked": lambda: layers.LSTM(6, num_layers=3, return_sequences=True),
    "gru_states": lambda: layers.GRU(6, num_layers=2, return_state=True),
    "lstm_states": lambda: layers.LSTM(6, return_sequences=True, return_state=True),
    "bi_lstm": lambda: layers.Bidirectional(layers.LSTM(5, return_sequences=True)),
    "bi_gru_last": lambda: layers.Bidirectional(layers.GRU(5)),
    "bi_gru_stacked_sum": lambda: layers.Bidirectional(layers.GRU(5, num_layers=2, return_sequences=True),
                                                       merge_mode="sum"),
    "bi_rnn_mul": lambda: layers.Bidirectional(layers.SimpleRNN(5, return_sequences=True), merge_mode="mul"),
    "bi_lstm_ave_states": lambda: layers.Bidirectional(layers.LSTM(5, return_state=True), merge_mode="ave"),
    "bi_gru_none": lambda: layers.Bidirectional(layers.GRU(5, return_sequences=True), merge_mode=None),
    # Keras' default: a padded step outputs the last real step's output
    "lstm_carry": lambda: layers.LSTM(6, return_sequences=True, zero_output_for_mask=False),
    "gru_carry_go_backwards": lambda: layers.GRU(6, return_sequences=True, go_backwards=True,
                                                 zero_output_for_mask=False),
}


@pytest.mark.parametrize("padding", ["post", "pre", "holes"])
@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_recurrent_layers_with_masks(name, padding, tmp_path, rng):
    model = token_model(RECURRENT[name]())
    assert_exports_like_predict(model, token_batches(rng, padding=padding), tmp_path)


@pytest.mark.parametrize("name", ["lstm_stacked", "bi_gru_last", "gru_go_backwards"])
def test_recurrent_layers_without_masks(name, tmp_path, rng):
    model = token_model(RECURRENT[name](), mask_zero=False)
    assert_exports_like_predict(model, token_batches(rng), tmp_path)


def test_recurrent_initial_states_from_the_graph(tmp_path, rng):
    """States given as tensors (Keras' ``initial_state=``), also for rows of length 0."""
    ids = attnx.Input((None,), dtype="int64")
    start = attnx.Input((6,))
    x = layers.Embedding(VOCAB, 8, mask_zero=True)(ids)
    y = layers.LSTM(6, return_sequences=True)(x, initial_state=[start, start])
    y2 = layers.Bidirectional(layers.GRU(6))(y, initial_state=[start, start])
    model = attnx.Model([ids, start], [y, y2])
    batches = [[padded_ids(rng, b, t), rng.standard_normal((b, 6)).astype(np.float32)] for b, t in ((4, 9), (3, 5))]
    assert_exports_like_predict(model, batches, tmp_path)


def test_cells(tmp_path, rng):
    x, h = attnx.Input((5,)), attnx.Input((4,))
    outputs = [layers.SimpleRNNCell(4, activation="relu")(x), layers.GRUCell(4, reset_after=False)(x, [h]),
               *layers.LSTMCell(4)([x, h, h]), layers.GRUCell(4)([x, h])]
    model = attnx.Model([x, h], outputs)
    batches = [[rng.standard_normal((b, 5)).astype(np.float32), rng.standard_normal((b, 4)).astype(np.float32)]
               for b in (3, 6)]
    assert_exports_like_predict(model, batches, tmp_path)


def test_bigru_luong_classifier(tmp_path, rng):
    """A BiGRU encoder whose last state queries its own outputs with Luong attention (general score,
    attentional state), then a softmax classifier."""
    ids = attnx.Input((None,), dtype="int64")
    x = layers.Embedding(VOCAB, 16, mask_zero=True)(ids)
    seq = layers.Bidirectional(layers.GRU(12, return_sequences=True))(x)
    last = layers.Bidirectional(layers.GRU(12))(x)
    attended = layers.LuongAttention(score="general", attentional_units=10)([last, seq])
    out = layers.Dense(3, activation="softmax")(layers.Dropout(0.3)(attended))
    model = attnx.Model(ids, out)
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(padded_ids(rng, 32, 9), rng.integers(0, 3, 32), epochs=1, verbose=0)
    assert_exports_like_predict(model, token_batches(rng, steps=(6, 14), sizes=(9, 1)), tmp_path)


# ------------------------------------------------------------------ attention
ATTENTION = {
    "dot": lambda: layers.Attention(),
    "scaled_dot_use_scale": lambda: layers.Attention(score="scaled_dot", use_scale=True),
    "general": lambda: layers.Attention(score="general"),
    "concat": lambda: layers.Attention(score="concat", units=7),
    "additive": lambda: layers.Attention(score="additive"),
    "additive_normalized": lambda: layers.BahdanauAdditiveAttention(units=5, normalize=True),
    "luong_dot": lambda: layers.LuongAttention(score="dot"),
    "luong_concat": lambda: layers.LuongAttention(score="concat", attentional_units=6),
    "local_m": lambda: layers.LocalAttention(2, mode="local-m", score="dot"),
    "local_p_concat": lambda: layers.LocalAttention(3, mode="local-p", score="concat"),
    "local_p_window_0": lambda: layers.LocalAttention(0, mode="local-p"),
    "hard_general": lambda: layers.HardAttention(score="general"),
}


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_attention_scores_with_query_and_value_masks(name, tmp_path, rng):
    """Queries of one sequence attend over another (its padding masked, the queries' padding zeroing
    their context), with the weights returned, and a causal self-attention."""
    query_ids, value_ids = attnx.Input((None,), dtype="int64"), attnx.Input((None,), dtype="int64")
    embed = layers.Embedding(VOCAB, 8, mask_zero=True)
    query, value = embed(query_ids), layers.GRU(8, return_sequences=True)(embed(value_ids))
    attention = ATTENTION[name]()
    context, weights = attention([query, value], return_attention_scores=True)
    causal = ATTENTION[name]()([value, value], use_causal_mask=True)
    model = attnx.Model([query_ids, value_ids], [context, weights, causal])
    batches = [[padded_ids(rng, 4, 5), padded_ids(rng, 4, 8)], [padded_ids(rng, 3, 9), padded_ids(rng, 3, 2)]]
    assert_exports_like_predict(model, batches, tmp_path)


def test_single_step_query_and_separate_key(tmp_path, rng):
    query = attnx.Input((6,))
    value, key = attnx.Input((None, 5)), attnx.Input((None, 4))
    out = layers.Attention(score="concat")([query, value, key])
    model = attnx.Model([query, value, key], out)
    batches = [[rng.standard_normal((b, 6)).astype(np.float32), rng.standard_normal((b, s, 5)).astype(np.float32),
                rng.standard_normal((b, s, 4)).astype(np.float32)] for b, s in ((3, 7), (5, 2))]
    assert_exports_like_predict(model, batches, tmp_path)


@pytest.mark.parametrize("return_sequences", [False, True])
def test_attention_pooling_length_agnostic_with_weights(return_sequences, tmp_path, rng):
    ids = attnx.Input((None,), dtype="int64")
    x = layers.LSTM(6, return_sequences=True)(layers.Embedding(VOCAB, 8, mask_zero=True)(ids))
    pooled, weights = layers.AttentionPooling(length_agnostic=True, return_sequences=return_sequences)(
        x, return_attention_scores=True)
    model = attnx.Model(ids, [pooled, weights])
    assert_exports_like_predict(model, token_batches(rng, padding="holes"), tmp_path)


def test_attention_pooling_ignoring_its_mask(tmp_path, rng):
    """The Keras tutorial's layer (use_mask=False) pools over the padded steps too."""
    model = token_model(layers.LSTM(6, return_sequences=True, zero_output_for_mask=False),
                        layers.AttentionPooling(use_mask=False), steps=9)
    assert_exports_like_predict(model, token_batches(rng, steps=(9, 9), padding="holes"), tmp_path)


# ------------------------------------------------------------------ transformer layers
def test_transformer_encoder_classifier(tmp_path, rng):
    """Two post-norm encoder layers (sinusoidal positions, padding mask from the embedding), then mean
    pooling over the real tokens and a classifier; trained a little."""
    ids = attnx.Input((None,), dtype="int64")
    x = layers.Embedding(VOCAB, 16, mask_zero=True)(ids)
    x = layers.PositionalEncoding()(x)
    x = layers.TransformerEncoder(2, num_heads=4, intermediate_dim=32, dropout=0.1)(x)
    out = layers.Dense(2, activation="softmax")(layers.GlobalAveragePooling1D()(x))
    model = attnx.Model(ids, out)
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(padded_ids(rng, 32, 10), rng.integers(0, 2, 32), epochs=1, verbose=0)
    assert_exports_like_predict(model, token_batches(rng, steps=(13, 300), sizes=(6, 2)), tmp_path)


TRANSFORMER = {
    "pre_norm_gelu_causal": lambda x: layers.TransformerEncoderLayer(2, 12, activation="gelu", norm_first=True)(
        x, use_causal_mask=True),
    "layer_norm_feed_forward": lambda x: layers.FeedForward(10, output_dim=5)(
        layers.LayerNormalization(epsilon=1e-3, center=False)(x)),
    "position_embedding": lambda x: layers.PositionEmbedding(16)(layers.LayerNormalization(scale=False)(x)),
    "multi_head_attention": lambda x: layers.MultiHeadAttention(2, 3, value_dim=5, output_shape=7)(
        x, layers.Dense(6)(x), return_attention_scores=True),
    "multi_head_attention_causal_no_bias": lambda x: layers.MultiHeadAttention(4, 2, use_bias=False)(
        x, x, x, use_causal_mask=True),
    "encoder_stack_pre_norm": lambda x: layers.TransformerEncoder(2, 2, 8, norm_first=True)(x),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMER))
def test_transformer_layers(name, tmp_path, rng):
    ids = attnx.Input((None,), dtype="int64")
    out = TRANSFORMER[name](layers.Embedding(VOCAB, 8, mask_zero=True)(ids))
    model = attnx.Model(ids, out)
    assert_exports_like_predict(model, token_batches(rng, steps=(5, 16)), tmp_path)


def test_transformer_decoder_with_padding_masks(tmp_path, rng):
    """Decoder layers (causal self-attention, cross-attention) with both sides' padding masks, and the
    attention mask arguments of multi-head attention given as model inputs."""
    target_ids, source_ids = attnx.Input((None,), dtype="int64"), attnx.Input((None,), dtype="int64")
    embed = layers.Embedding(VOCAB, 8, mask_zero=True)
    target, memory = embed(target_ids), layers.TransformerEncoderLayer(2, 16)(embed(source_ids))
    y = layers.TransformerDecoder(2, 2, 16)([target, memory])
    y, self_weights, cross_weights = layers.TransformerDecoderLayer(2, 16, norm_first=True)(
        [y, memory], return_attention_scores=True)
    model = attnx.Model([target_ids, source_ids], [y, self_weights, cross_weights])
    batches = [[padded_ids(rng, 3, 4), padded_ids(rng, 3, 6)], [padded_ids(rng, 5, 7), padded_ids(rng, 5, 3)]]
    for batch in batches:  # a target row of only padding attends to nothing at all: keep one real token
        batch[0][:, 0] = 1
    assert_exports_like_predict(model, batches, tmp_path)


def test_multi_head_attention_masks_as_inputs(tmp_path, rng):
    x_in, mask_in, padding_in = attnx.Input((None, 6)), attnx.Input((None, None), dtype="bool"), \
        attnx.Input((None,), dtype="bool")
    y = layers.MultiHeadAttention(2, 3)(x_in, x_in, attention_mask=mask_in, key_padding_mask=padding_in)
    model = attnx.Model([x_in, mask_in, padding_in], y)
    batches = [[rng.standard_normal((b, t, 6)).astype(np.float32), rng.random((b, t, t)) < 0.7,
                rng.random((b, t)) < 0.7] for b, t in ((3, 5), (2, 8))]
    assert_exports_like_predict(model, batches, tmp_path)


# ------------------------------------------------------------------ core layers and composition
def test_core_layers_and_nested_models(tmp_path, rng):
    inner = attnx.Sequential([layers.Dense(6, activation="gelu", input_shape=(4, 3)), layers.Activation("tanh")])
    x_in = attnx.Input((4, 3))
    a = inner(x_in)
    b = layers.Dense(6, activation="relu")(x_in)
    merged = layers.Concatenate()([layers.Add()([a, b]), a])
    flat = layers.Flatten()(merged)
    shaped = layers.Reshape((8, -1))(flat)
    out = layers.Dense(3, activation="softmax", use_bias=False)(layers.GlobalAveragePooling1D()(shaped))
    model = attnx.Model(x_in, [out, layers.Activation("sigmoid")(flat)])
    batches = [rng.standard_normal((b, 4, 3)).astype(np.float32) for b in (5, 1)]
    assert_exports_like_predict(model, batches, tmp_path)


def test_merged_masks_reach_the_next_layer(tmp_path, rng):
    ids = attnx.Input((None,), dtype="int64")
    embed = layers.Embedding(VOCAB, 4, mask_zero=True)
    x = layers.Concatenate()([embed(ids), layers.Dense(4)(embed(ids))])
    out = layers.GRU(5)(x)
    model = attnx.Model(ids, out)
    assert_exports_like_predict(model, token_batches(rng, padding="holes"), tmp_path)


# ------------------------------------------------------------------ image layers
def _random_image_layer(kind, padding, rng):
    """A Conv2D / MaxPooling2D / AveragePooling2D of random window and strides (rows and cols apart)."""
    window, strides = tuple(int(v) for v in rng.integers(1, 5, 2)), tuple(int(v) for v in rng.integers(1, 4, 2))
    if kind == "Conv2D":
        return layers.Conv2D(int(rng.integers(1, 5)), window, strides=strides, padding=padding,
                             activation=str(rng.choice(["linear", "relu", "tanh", "softmax"])),
                             use_bias=bool(rng.integers(0, 2)), bias_initializer="glorot_uniform")
    return getattr(layers, kind)(window, strides=strides, padding=padding)


def _images(rng, batch, rows, cols, channels):
    return rng.standard_normal((batch, rows, cols, channels)).astype(np.float32)


@pytest.mark.parametrize("size", ["fixed", "open", "dynamic_steps"])
@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("kind", ["Conv2D", "MaxPooling2D", "AveragePooling2D"])
def test_image_layers_of_random_geometries(kind, padding, size, tmp_path, rng):
    """Odd and even sizes, strides above and below the window: 'same' pads are constants when the Input
    fixes the size, computed in the graph when it is open (or opened by dynamic_steps=True)."""
    for case in range(4):
        layer = _random_image_layer(kind, padding, rng)
        rows, cols = (int(v) for v in rng.integers(4, 10, 2))
        inputs = attnx.Input((None, None, 3) if size == "open" else (rows, cols, 3))
        model = attnx.Model(inputs, layer(inputs))
        path = export.to_onnx(model, tmp_path / f"{case}.onnx", dynamic_steps=size == "dynamic_steps")
        sess = session(path)
        sizes = [(rows, cols)] + {"fixed": [], "open": [(rows + 1, cols + 2), (4, 5)],
                                  "dynamic_steps": [(rows + 1, cols), (rows + 2, cols)]}[size]
        for batch, (r, c) in zip((3, 1, 2), sizes):
            x = _images(rng, batch, r, c, 3)
            np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0],
                                       model.predict(x, batch_size=batch), **TOLERANCE,
                                       err_msg=f"{layer.get_config()} on {x.shape}")


@pytest.mark.parametrize("pooling", ["attention", "average"])
def test_small_cnn(pooling, tmp_path, rng):
    """Conv2D -> MaxPooling2D -> Conv2D -> AveragePooling2D -> regions (B, L, C) -> pooled -> Dense."""
    inputs = attnx.Input((13, 11, 3))
    x = layers.Conv2D(6, 3, strides=2, padding="same", activation="relu")(inputs)
    x = layers.MaxPooling2D(3, strides=1, padding="same")(x)
    x = layers.Conv2D(8, (2, 3), activation="tanh")(x)
    x = layers.AveragePooling2D(2, strides=(1, 2), padding="same")(x)
    x = layers.Reshape((-1, 8))(x)
    x = layers.AttentionPooling()(x) if pooling == "attention" else layers.GlobalAveragePooling1D()(x)
    model = attnx.Model(inputs, layers.Dense(4, activation="softmax")(x))
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(_images(rng, 16, 13, 11, 3), rng.integers(0, 4, 16), epochs=1, batch_size=8, verbose=0)
    assert_exports_like_predict(model, [_images(rng, b, 13, 11, 3) for b in (5, 1, 2)], tmp_path)


# ------------------------------------------------------------------ Seq2Seq
SEQ2SEQ = {
    "bahdanau_gru": dict(attention="bahdanau"),
    "bahdanau_lstm_bidirectional": dict(attention="bahdanau", cell="lstm", bidirectional=True),
    "luong_general_gru": dict(attention="luong", score="general"),
    "luong_dot_lstm": dict(attention="luong", score="dot", cell="lstm"),
    "luong_concat_gru_bidirectional": dict(attention="luong", score="concat", bidirectional=True),
    "luong_local_m": dict(attention="luong", score="general", local_window=2, local_mode="m"),
    "luong_local_p_lstm": dict(attention="luong", score="concat", cell="lstm", local_window=3, local_mode="p"),
}


@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_seq2seq_greedy_loop_equals_greedy_decode(name, tmp_path, rng):
    model = Seq2Seq(VOCAB, 17, embedding_dim=8, units=12, start_token=1, end_token=2, max_length=9, **SEQ2SEQ[name])
    folder = export.to_onnx(model, tmp_path / "seq2seq")
    for path in (folder / "encoder.onnx", folder / "decoder.onnx"):
        onnx.checker.check_model(onnx.load(str(path)))
    translator = export.OnnxSeq2Seq(folder)
    for batch, steps in ((6, 7), (2, 12)):
        source = padded_ids(rng, batch, steps)
        source[:, 0] = 3  # no empty sentence
        tokens, attention = translator.greedy_decode(source)
        want_tokens, want_attention = model.greedy_decode(source)
        np.testing.assert_array_equal(tokens, want_tokens)
        np.testing.assert_allclose(attention, want_attention, **TOLERANCE)


def tiny_corpus():
    words = {"one": "un", "two": "deux", "three": "trois", "cat": "chat", "dog": "chien"}
    pick = np.random.default_rng(0)
    src, tgt = [], []
    for _ in range(200):
        chosen = list(pick.choice(list(words), pick.integers(1, 4)))
        src.append("<start> " + " ".join(chosen) + " . <end>")
        tgt.append("<start> " + " ".join(words[w] for w in chosen) + " . <end>")
    return src, tgt


def test_seq2seq_translate_in_onnx_runtime_equals_translate(tmp_path):
    src, tgt = tiny_corpus()
    model = Seq2Seq.from_texts(src, tgt, embedding_dim=16, units=32, max_length=8, attention="luong")
    model.compile(attnx.optimizers.Adam(0.01))
    model.fit_texts(src, tgt, batch_size=32, epochs=8, verbose=0)
    folder = export.to_onnx(model, tmp_path / "translator")
    for sentence in ("<start> cat two . <end>", "<start> dog . <end>", "<start> three one cat . <end>"):
        words, attention = export.onnx_greedy_translate(folder, sentence)
        want_words, want_attention = model.translate(sentence)
        assert words == want_words
        np.testing.assert_allclose(attention, want_attention, **TOLERANCE)
    with pytest.raises(ValueError, match="unknown source word"):
        export.onnx_greedy_translate(folder, "<start> cat bird . <end>")


# ------------------------------------------------------------------ bad input
def test_sampling_hard_attention_raises_naming_the_layer(tmp_path):
    seq = attnx.Input((None, 4))
    attention = layers.HardAttention(inference="sample")
    model = attnx.Model(seq, attention([seq, seq]))
    with pytest.raises(export.UnsupportedLayerError, match=f"'{attention.name}' \\(HardAttention\\).*sample"):
        export.to_onnx(model, tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()


def test_call_layer_raises_naming_the_layer(tmp_path):
    class Doubling(layers.Layer):
        def call(self, x):
            return attnx.ops.multiply(x, 2.0)

    x = attnx.Input((3,))
    doubling = Doubling(name="doubling")
    model = attnx.Model(x, layers.Dense(2)(doubling(x)))
    with pytest.raises(export.UnsupportedLayerError, match="'doubling' \\(Doubling\\).*`call`"):
        export.to_onnx(model, tmp_path / "model.onnx")


def test_mask_given_as_lengths_raises_naming_the_layer(tmp_path):
    x, lengths = attnx.Input((None, 6)), attnx.Input((), dtype="int64")
    attention = layers.MultiHeadAttention(2, 3, name="mha")
    model = attnx.Model([x, lengths], attention(x, x, key_padding_mask=lengths))
    with pytest.raises(export.UnsupportedLayerError, match="'mha'.*key_padding_mask"):
        export.to_onnx(model, tmp_path / "model.onnx")


def test_unbuilt_model_and_bad_paths(tmp_path):
    unbuilt = attnx.Sequential([layers.Dense(2)])
    with pytest.raises(ValueError, match="not built"):
        export.to_onnx(unbuilt, tmp_path / "model.onnx")
    model = attnx.Sequential([layers.Dense(2, input_shape=(3,))])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export.to_onnx(model, tmp_path / "missing" / "model.onnx")
    with pytest.raises(IsADirectoryError):
        export.to_onnx(model, tmp_path)
    with pytest.raises(TypeError, match="expected an attnx Model"):
        export.to_onnx(layers.Dense(2), tmp_path / "model.onnx")
    seq2seq = Seq2Seq(VOCAB, VOCAB, embedding_dim=4, units=6, start_token=1, end_token=2)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        export.to_onnx(seq2seq, tmp_path / "file")
    with pytest.raises(FileNotFoundError, match="encoder.onnx"):
        export.OnnxSeq2Seq(tmp_path)


def test_class_model_other_than_seq2seq_raises_naming_it(tmp_path):
    from attnx.vision import ImageCaptioner
    encoder = attnx.Sequential([layers.Reshape((16, 4), input_shape=(4, 4, 4)), layers.Dense(8)])
    captioner = ImageCaptioner(encoder, (4, 4, 4), vocab_size=12)
    captioner.build()
    with pytest.raises(export.UnsupportedLayerError, match=r"'image_captioner[_0-9]*' \(ImageCaptioner\) is a class model"):
        export.to_onnx(captioner, tmp_path / "captioner.onnx")


def test_supported_layers_are_listed():
    assert {"Embedding", "LSTM", "GRU", "Bidirectional", "AttentionPooling", "MultiHeadAttention",
            "TransformerEncoder", "TransformerDecoderLayer", "PositionalEncoding", "Conv2D", "MaxPooling2D",
            "AveragePooling2D"} <= set(export.SUPPORTED_LAYERS)
    assert "Layer" not in export.SUPPORTED_LAYERS
