"""int8 in the transformer (issue 39): MultiHeadAttention's projections, FeedForward and the
transformer layers, stacks and translator quantize. A contract over every public layer
(test_layer_contract.CASES): a layer that `quantize` accepts stays within the guide's typical error,
refuses to train, and its config rebuilds it quantized; each int8 product of the attention holds the
guide's bound on adversarial inputs; the cached decoder step equals the int8 forward; a quantized
Transformer saves, loads and translates as its float32 self for most sentences."""
import numpy as np
import pytest

import attnx
from attnx import layers, quantization
from attnx.seq2seq import Transformer
from test_layer_contract import CASES
from test_quantization import TYPICAL_ERROR
from test_quantization_contract import _adversarial_inputs, _bound_holds, _cancelling_kernel

# the public layers that hold int8 weights once quantized (a layer that gains an int8 form joins it)
QUANTIZED = {"Dense", "Embedding", "SimpleRNN", "GRU", "LSTM", "Bidirectional", "SimpleRNNCell", "GRUCell",
             "LSTMCell", "FeedForward", "MultiHeadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer",
             "TransformerEncoder", "TransformerDecoder", "TimeDistributed"}
# composite layers whose sublayers are made by their build: they quantize with the model that holds them
# (its saved header says so), their own config does not carry the mode
QUANTIZED_WITH_THE_MODEL = {"FeedForward", "TransformerEncoderLayer", "TransformerDecoderLayer",
                            "TransformerEncoder", "TransformerDecoder"}


def _float32(layer):
    """The contract's float64 layer as float32 (int8 layers compute in float32)."""
    config = layer.get_config()
    for wrapped in ("layer", "backward_layer"):  # Bidirectional: the wrapped layers' configs too
        if wrapped in config:
            config[wrapped] = {**config[wrapped], "config": {**config[wrapped]["config"], "dtype": "float32"}}
    return type(layer).from_config({**config, "dtype": "float32"})


def _call(layer, spec, **extra):
    xs = [np.asarray(a, np.float32) if np.asarray(a).dtype.kind == "f" else a for a, how in spec if how == "x"]
    args = [np.asarray(a, np.float32) for a, how in spec if how == "arg"]
    kwargs = {how: a for a, how in spec if how not in ("x", "arg")}
    out = layer(xs[0] if len(xs) == 1 else xs, *args, **kwargs, **extra)
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out]) if o is not None]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_layer_quantize_accepts_stays_within_the_typical_error(rng, name):
    make, inputs = CASES[name]
    layer = _float32(make())
    spec = inputs(rng, 3, 6)
    want = _call(layer, spec)
    try:
        layer.quantize("int8")
    except ValueError as exc:  # a refusal names the layer and changes nothing
        assert "cannot be quantized" in str(exc) and name not in QUANTIZED
        assert all(p.dtype != np.int8 for p in layer.params.values())
        return
    int8 = [n for n, p in layer.params.items() if p.dtype == np.int8]
    assert bool(int8) == (name in QUANTIZED), f"{name}: int8 weights {int8}"
    got = _call(layer, spec)
    for g, w in zip(got, want):
        scale = max(np.abs(w).max(), 1e-6)
        assert np.abs(g - w).max() <= TYPICAL_ERROR * scale, f"{name}: {np.abs(g - w).max() / scale:.4f}"
    if not int8:
        return
    assert layer.quantization_mode == "int8" or name == "TimeDistributed"  # says its wrapped layer's config
    assert any(not np.array_equal(g, w) for g, w in zip(got, want))  # the int8 path ran
    with pytest.raises(ValueError, match="runs inference only"):
        _call(layer, spec, training=True)
    if name in QUANTIZED_WITH_THE_MODEL:
        assert "quantization_mode" not in layer.get_config()
        return
    # its config builds it quantized, and its weights load into that
    twin = type(layer).from_config(layer.get_config())
    _call(twin, spec)
    twin.set_weights(layer.get_weights())
    for g, t in zip(got, _call(twin, spec)):
        np.testing.assert_array_equal(g, t)


def test_int8_layers_and_what_stays_float32():
    attention = layers.MultiHeadAttention(2, 4)
    attention(np.zeros((1, 3, 8), np.float32), np.zeros((1, 3, 8), np.float32))
    assert attention.quantizable_weights() == {"query_kernel": "columns", "key_kernel": "columns",
                                               "value_kernel": "columns", "output_kernel": "head_columns"}
    attention.quantize("int8")
    assert attention.params["output_kernel_scale"].shape == (8,)  # one per output unit, over heads x value_dim
    assert attention.params["query_kernel_scale"].shape == (2, 4)
    assert attention.get_config()["quantization_mode"] == "int8"
    encoder = layers.TransformerEncoderLayer(2, 16)
    encoder(np.zeros((1, 3, 8), np.float32))
    encoder.quantize("int8")
    dtypes = {n: p.dtype for n, p in encoder.params.items()}
    assert all(dtypes[n] == np.int8 for n in dtypes if n.endswith("kernel"))
    assert all(dtypes[n] == np.float32 for n in dtypes if "norm" in n or n.endswith("bias"))


@pytest.mark.parametrize("name", ["query", "key", "value", "output"])
def test_attention_products_hold_the_bound_under_outliers_and_cancellation(rng, name):
    K = 16
    attention = layers.MultiHeadAttention(2, 8)
    x = np.zeros((1, 9, K), np.float32)
    attention(x, x)
    kernel = attention.matrix(name)
    kernel[...] = _cancelling_kernel(rng, K, kernel.shape[1])  # a view: the weight itself
    rows = _adversarial_inputs(rng, 9, K)
    rows[2::3] = 1.0
    want = attention.project(name, rows[None])[0]
    bound = quantization.dense_error_bound(rows, kernel)
    attention.quantize("int8")
    got = attention.project(name, rows[None])[0]
    _bound_holds(got, want, bound)
    assert np.abs(got[1::3] - want[1::3]).max() > 0  # the int8 product ran


@pytest.mark.parametrize("norm_first", [False, True])
def test_int8_cached_step_equals_the_int8_forward(rng, norm_first):
    target = rng.normal(size=(3, 5, 16)).astype(np.float32)
    memory = rng.normal(size=(3, 6, 16)).astype(np.float32)
    source_mask = np.ones((3, 6), bool)
    source_mask[1, 4:] = False
    decoder = layers.TransformerDecoder(2, 4, 32, norm_first=norm_first)
    decoder([target, memory])
    float_weights = decoder.get_weights()
    decoder.quantize("int8")
    want, _, cross = decoder.forward([target, memory], encoder_padding_mask=source_mask,
                                     return_attention_scores=True)[0]
    cache = decoder.start_cache(memory, source_mask, capacity=2)  # grows
    steps = [decoder.step(target[:, t], cache, return_attention_scores=True) for t in range(5)]
    np.testing.assert_allclose(np.stack([y for y, _, _ in steps], 1), want, atol=2e-6)
    np.testing.assert_allclose(steps[-1][2], cross[-1][:, :, -1], atol=1e-6)  # the last layer's cross-attention
    # new int8 values (set_weights) reach the step's kernels packed side by side
    decoder.set_weights([-w if w.dtype == np.int8 else w for w in decoder.get_weights()])
    want = decoder.forward([target, memory], encoder_padding_mask=source_mask)[0]
    cache = decoder.start_cache(memory, source_mask)
    got = np.stack([decoder.step(target[:, t], cache)[0] for t in range(5)], 1)
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert np.abs(got - np.stack([y for y, _, _ in steps], 1)).max() > 0.1
    encoder = layers.TransformerEncoder(2, 4, 32, norm_first=norm_first)
    encoder(target)
    encoder.quantize("int8")
    want = encoder(target, use_causal_mask=True)
    cache = encoder.start_cache(3)
    got = np.stack([encoder.step(target[:, t], cache)[0] for t in range(5)], 1)
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert len(float_weights) < len(decoder.get_weights())  # each kernel gained its scale


def _copy_task(rng, n, vocab=14, length=6):
    """Sequences of ids 3..vocab-1 and their reverse (1 start, 2 end)."""
    source = rng.integers(3, vocab, (n, length))
    target = np.concatenate([np.ones((n, 1), int), source[:, ::-1], np.full((n, 1), 2)], axis=1)
    return source, target


@pytest.fixture(scope="module")
def trained_translator():
    rng = np.random.default_rng(1)
    attnx.set_random_seed(1)
    model = Transformer(14, 14, model_dim=32, num_heads=4, intermediate_dim=64, num_encoder_layers=2,
                        num_decoder_layers=2, start_token=1, end_token=2, max_length=9, dropout=0.0)
    source, target = _copy_task(rng, 512)
    model.compile(optimizer=attnx.optimizers.Adam(3e-3))
    model.fit(source, target, epochs=12, batch_size=32, verbose=0)
    return model, _copy_task(np.random.default_rng(2), 64)


def test_int8_translator_matches_float32_saves_and_loads(trained_translator, tmp_path):
    model, (source, target) = trained_translator
    model.save(tmp_path / "float.attnx")
    quantized = attnx.load_model(tmp_path / "float.attnx").quantize("int8")
    want = model.greedy_decode(source, return_attention=False)[0]
    got = quantized.greedy_decode(source, return_attention=False)[0]
    assert np.mean(np.all(want == target[:, 1:], axis=1)) >= 0.5  # the float model learned the task
    same = np.mean([np.array_equal(g, w) for g, w in zip(got, want)])
    assert same >= 0.9, f"int8 greedy translations equal to float32's: {same:.0%}"
    assert all(quantized.params[n].dtype == np.int8 for n in quantized.params
               if n.endswith("kernel") and "norm" not in n)
    quantized.save(tmp_path / "int8.attnx")
    loaded = attnx.load_model(tmp_path / "int8.attnx")
    assert loaded.quantization_mode == "int8"
    np.testing.assert_array_equal(loaded.greedy_decode(source, return_attention=False)[0], got)
    beams = [[list(h.tokens) for h in sentence] for sentence in quantized.beam_search(source[:8], width=3)]
    assert [[list(h.tokens) for h in sentence] for sentence in loaded.beam_search(source[:8], width=3)] == beams


def test_a_quantized_transformer_does_not_convert_to_ctranslate2(tmp_path):
    pytest.importorskip("ctranslate2")
    from attnx.export.ctranslate2 import to_ctranslate2
    sources, targets = ["a b c d", "b c d e", "c d e f"] * 20, ["x y z", "y z w", "z w v"] * 20
    model = Transformer.from_texts(sources, targets, vocab_size=30, model_dim=8, num_heads=2, intermediate_dim=16,
                                   num_encoder_layers=1, num_decoder_layers=1, norm_first=True)
    model.build()
    to_ctranslate2(model, tmp_path / "float")
    model.quantize("int8")
    with pytest.raises(ValueError, match="is quantized \\(int8\\); convert the float32 model"):
        to_ctranslate2(model, tmp_path / "int8")


def test_int8_self_attention_projects_query_key_and_value_in_one_product(rng):
    x = rng.normal(size=(2, 7, 16)).astype(np.float32)
    attention = layers.MultiHeadAttention(4, 4, value_dim=6)
    attention(x, x)
    attention.quantize("int8")
    together = attention(x, x)  # one array: the fused product
    apart = attention(x, x.copy())  # another array of the same values: three products
    np.testing.assert_allclose(together, apart, atol=1e-6)
    attention.set_weights([-w if w.dtype == np.int8 else w for w in attention.get_weights()])
    np.testing.assert_allclose(attention(x, x), attention(x, x.copy()), atol=1e-6)  # set_weights reaches both


def test_int8_transformer_layers_agree_at_every_simd_level(rng):
    from attnx import _core
    from conftest import CPU_SIMD_LEVELS
    x = rng.normal(size=(3, 6, 16)).astype(np.float32)
    memory = rng.normal(size=(3, 5, 16)).astype(np.float32)
    decoder = layers.TransformerDecoderLayer(4, 32)
    decoder([x, memory])
    decoder.quantize("int8")
    outs = []
    try:
        for level in CPU_SIMD_LEVELS:
            _core._force_simd_level(level)
            outs.append(decoder([x, memory]))
    finally:
        _core._force_simd_level("avx512")
    for out in outs[1:]:  # the same integers; the float epilogue may round differently (fused multiply-adds)
        np.testing.assert_allclose(out, outs[0], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- the C++ step and search in int8
def _python_search(model, method, *args, **kwargs):
    """`model.method(...)` with the search calling the Python step back (compiled_step hidden)."""
    model.compiled_step = lambda state, max_length: None
    try:
        return getattr(model, method)(*args, **kwargs)
    finally:
        del model.compiled_step


@pytest.mark.parametrize("norm_first", [False, True])
def test_quantized_translator_decodes_in_the_cpp_step(rng, norm_first):
    attnx.set_random_seed(3)
    model = Transformer(40, 40, model_dim=32, num_heads=4, intermediate_dim=48, num_encoder_layers=1,
                        num_decoder_layers=2, start_token=1, end_token=2, max_length=7, dropout=0.0,
                        norm_first=norm_first, shared_embeddings=True)
    source = rng.integers(3, 40, (5, 6))
    source[1, 4:] = 0
    model.quantize("int8")
    # the compiled step takes the packed int8 kernels, the int8 embedding rows and the packed output kernel
    kernel, arguments = model.compiled_step(model._start(source), model.max_length)
    assert arguments["embedding"].dtype == np.int8 and arguments["embedding_row_scale"] is not None
    assert isinstance(arguments["output_kernel"], attnx.kernels.Int8Kernel)
    layer = arguments["weights"][0]
    assert isinstance(layer[2], attnx.kernels.Int8Kernel) and layer[2].shape == (32, 96)  # q, k, v in one
    assert layer[4] is None and layer[6] is None
    # the step's logits at each position equal the int8 teacher-forced forward's
    tokens = np.concatenate([np.ones((5, 1), np.int64), rng.integers(3, 40, (5, 4))], axis=1)
    want = model([source, tokens])
    state = model._start(source)
    for t in range(tokens.shape[1]):
        logits, state, _ = model.step(tokens[:, t], t, state)
        np.testing.assert_allclose(logits, want[:, t], atol=1e-5, rtol=1e-5)
    # greedy and beam search in C++ give the Python step's tokens and scores
    got, got_scores, got_attention = model.greedy_decode(source)
    ref, ref_scores, ref_attention = _python_search(model, "greedy_decode", source)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_allclose(got_scores, ref_scores, atol=1e-4)
    np.testing.assert_allclose(got_attention, ref_attention, atol=1e-5)
    beams = model.beam_search(source, width=3, length_penalty=0.6)
    ref_beams = _python_search(model, "beam_search", source, width=3, length_penalty=0.6)
    assert [[list(h.tokens) for h in b] for b in beams] == [[list(h.tokens) for h in b] for b in ref_beams]
    np.testing.assert_allclose([h.score for b in beams for h in b], [h.score for b in ref_beams for h in b],
                               atol=1e-4)


def test_a_partly_quantized_translator_decodes_the_same_in_cpp_and_python(rng):
    """Each product of the step is float or int8 on its own: the decoder stack alone quantized (the
    embedding and output projection float), or the output projection alone."""
    source = rng.integers(3, 30, (4, 5))
    for part in ("decoder", "output_projection"):
        attnx.set_random_seed(4)
        model = Transformer(30, 30, model_dim=16, num_heads=2, intermediate_dim=32, num_encoder_layers=1,
                            num_decoder_layers=2, start_token=1, end_token=2, max_length=6, dropout=0.0)
        float_scores = model.greedy_decode(source)[1]
        getattr(model, part).quantize("int8")
        assert not np.allclose(model.greedy_decode(source)[1], float_scores, rtol=0, atol=1e-7)  # int8 ran
        got = model.beam_search(source, width=2)
        want = _python_search(model, "beam_search", source, width=2)
        assert [[list(h.tokens) for h in b] for b in got] == [[list(h.tokens) for h in b] for b in want], part
        np.testing.assert_allclose([h.score for b in got for h in b], [h.score for b in want for h in b],
                                   atol=1e-4)


def test_the_search_binding_refuses_what_an_int8_step_cannot_take(rng):
    attnx.set_random_seed(5)
    model = Transformer(20, 20, model_dim=16, num_heads=2, intermediate_dim=32, num_encoder_layers=1,
                        num_decoder_layers=1, start_token=1, end_token=2, max_length=5, dropout=0.0)
    model.quantize("int8")
    source = rng.integers(3, 20, (2, 4))
    kernel, arguments = model.compiled_step(model._start(source), 5)
    search = dict(start_id=1, end_id=2, width=1, length_penalty=0.0, max_length=5, return_attention=False)
    kernel(**arguments, **search)
    layer = list(arguments["weights"][0])
    ff = model.decoder.blocks[0].feed_forward.intermediate_dense

    def weights_with(slot, value):
        changed = list(layer)
        changed[slot] = value
        return [changed]

    cases = [
        ({"weights": weights_with(18, ff.params["kernel"])}, TypeError, "an int8 array; pass it packed"),
        ({"weights": weights_with(8, layer[18])}, ValueError, r"self output kernel: expected an int8 kernel packed "
                                                              r"as \(16, 16\)"),
        ({"weights": weights_with(4, np.zeros((16, 16), np.float32))}, ValueError,
         "self key kernel: expected shape|self query kernel: expected an int8 kernel packed as \\(16, 16\\)"),
        ({"weights": weights_with(6, np.zeros((16, 16), np.float32))}, ValueError,
         "self value kernel given without the self key kernel"),
        ({"embedding_row_scale": None}, ValueError, "int8 embedding needs its embedding_row_scale"),
        ({"embedding": arguments["embedding"].astype(np.int16)}, ValueError,
         "embedding_row_scale belongs to an int8 embedding"),
        ({"embedding": arguments["embedding"].astype(np.float32)}, ValueError,
         "embedding_row_scale belongs to an int8 embedding"),
        ({"embedding": arguments["embedding"].astype(np.int16), "embedding_row_scale": None}, TypeError,
         "embedding: expected dtype float32"),
        ({"output_kernel": None}, ValueError, "output_bias given without output_kernel|tied output projection"),
        ({"output_kernel": model.output_projection.params["kernel"]}, TypeError, "output_kernel: an int8 array"),
        ({"cross_keys": arguments["cross_keys"].astype(np.float64),
          "cross_values": arguments["cross_values"].astype(np.float64)}, TypeError,
         "an int8 kernel runs in a float32 step|expected dtype float64"),
    ]
    for change, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            kernel(**{**arguments, **change}, **search)
