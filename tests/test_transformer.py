"""Transformer blocks: layer normalization, positional encodings, feed-forward, multi-head
attention, encoder / decoder layers and stacks.

Float64 gradient checks on tiny shapes (with dropout, through fixed masks), parity with PyTorch
(outputs and every gradient) for each mask kind and both norm orders, the converters both ways,
masks that never give NaN, and bad input."""
import functools

import numpy as np
import pytest

import attnx
from attnx import layers
from attnx.interop import from_torch, to_torch
from attnx.testing import assert_close, gradcheck, torch_parity

B, T, S, D, H = 2, 3, 4, 4, 2


def rand(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def with_fixed_dropout(layer, seed=7):
    """Reseeds attnx before every forward pass, so dropout draws the same masks each time and
    central differences see one fixed function."""
    forward = layer.forward

    @functools.wraps(forward)
    def reseeded(*args, **kwargs):
        attnx.set_random_seed(seed)
        return forward(*args, **kwargs)
    layer.forward = reseeded
    return layer


# ----------------------------------------------------------------------------- kernels
def test_layernorm_matches_numpy_with_settable_epsilon():
    x = rand(5, 7, seed=1) * 3 + 10  # a large mean: the two-pass variance keeps its precision
    gamma, beta = rand(7, seed=2), rand(7, seed=3)
    for eps in (1e-3, 1e-5):
        y, mean, rstd = attnx._core.layernorm_forward(x, gamma, beta, eps)
        want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * gamma + beta
        assert_close(y, want, atol=1e-12, what=f"layernorm eps={eps}")
        assert_close(rstd, 1 / np.sqrt(x.var(-1) + eps), atol=1e-12, what="rstd")
    assert layers.LayerNormalization().epsilon == 1e-3  # Keras' default


def test_sinusoidal_table_is_vaswanis():
    table = attnx._core.sinusoidal_table(6, 8, np.dtype("float64"))
    t, i = np.arange(6)[:, None], np.arange(4)[None, :]
    angle = t / 10000 ** (2 * i / 8)
    assert_close(table[:, 0::2], np.sin(angle), atol=1e-12, what="even features")
    assert_close(table[:, 1::2], np.cos(angle), atol=1e-12, what="odd features")


def test_dropout_keep_is_scaled_repeatable_and_at_rate():
    keep = attnx._core.random_keep([200, 500], 0.25, 42, 0, np.dtype("float32"))
    assert set(np.unique(keep)) == {0.0, np.float32(1 / 0.75)}
    assert abs((keep == 0).mean() - 0.25) < 0.01
    assert np.array_equal(keep, attnx._core.random_keep([200, 500], 0.25, 42, 0, np.dtype("float32")))
    assert not np.array_equal(keep, attnx._core.random_keep([200, 500], 0.25, 43, 0, np.dtype("float32")))


# ----------------------------------------------------------------------------- gradient checks
@pytest.mark.parametrize("make", [
    lambda: layers.LayerNormalization(dtype="float64"),
    lambda: layers.LayerNormalization(epsilon=1e-5, center=False, dtype="float64"),
    lambda: layers.PositionalEncoding(dtype="float64"),
    lambda: layers.PositionEmbedding(5, dtype="float64"),
    lambda: layers.FeedForward(6, activation="relu", dtype="float64"),
    lambda: layers.FeedForward(6, activation="gelu", output_dim=3, dtype="float64"),
], ids=["layernorm", "layernorm-no-center", "sinusoidal", "learned-positions", "ff-relu", "ff-gelu"])
def test_gradcheck_blocks(make):
    gradcheck(make(), rand(B, T, D))


MHA_MASKS = {
    "none": {},
    "key-padding": {"key_padding_mask": np.array([[1, 1, 0, 1], [1, 0, 0, 0]], bool)},
    "lengths": {"key_padding_mask": np.array([4, 2])},
    "attention-mask": {"attention_mask": rand(B, T, S, seed=9) > 0},  # some rows fully masked
    "shared-attention-mask-and-padding": {"attention_mask": rand(T, S, seed=8) > -0.5,
                                          "key_padding_mask": np.array([3, 4])},
}


@pytest.mark.parametrize("kwargs", MHA_MASKS.values(), ids=MHA_MASKS.keys())
def test_gradcheck_multi_head_cross_attention(kwargs):
    layer = layers.MultiHeadAttention(H, 3, value_dim=2, output_shape=5, dtype="float64")
    gradcheck(layer, [rand(B, T, D, seed=1), rand(B, S, 6, seed=2), rand(B, S, 3, seed=3)], call_kwargs=kwargs)


def test_gradcheck_multi_head_self_attention_causal_with_dropout_and_weight_gradients():
    layer = with_fixed_dropout(layers.MultiHeadAttention(H, 2, dropout=0.4, dtype="float64"))
    x = rand(B, T, D, seed=1)
    # the returned weights get an upstream gradient too (backward takes (doutput, dweights))
    gradcheck(layer, [x, x], call_kwargs={"use_causal_mask": True, "return_attention_scores": True})


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_gradcheck_encoder_layer_with_dropout(norm_first):
    layer = with_fixed_dropout(layers.TransformerEncoderLayer(H, 5, dropout=0.3, activation="gelu",
                                                              norm_first=norm_first, dtype="float64"))
    gradcheck(layer, rand(B, T, D), call_kwargs={"padding_mask": np.array([2, 3])})


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_gradcheck_decoder_layer_with_dropout(norm_first):
    layer = with_fixed_dropout(layers.TransformerDecoderLayer(H, 5, dropout=0.3, norm_first=norm_first,
                                                              dtype="float64"))
    gradcheck(layer, [rand(B, T, D, seed=1), rand(B, S, 6, seed=2)],
              call_kwargs={"encoder_padding_mask": np.array([4, 1]), "decoder_padding_mask": np.array([3, 2])})


def test_gradcheck_stacks():
    gradcheck(layers.TransformerEncoder(2, H, 5, dtype="float64"), rand(B, T, D), max_elements=8)
    gradcheck(layers.TransformerDecoder(2, H, 5, norm_first=True, dtype="float64"),
              [rand(B, T, D, seed=1), rand(B, S, D, seed=2)], max_elements=8)


# ----------------------------------------------------------------------------- PyTorch parity
def randomize(torch, module, std=0.3):
    """Non-trivial weights everywhere (torch starts biases and norms at 0 and 1)."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, std)
    return module


def test_layernorm_parity(torch):
    module = randomize(torch, torch.nn.LayerNorm(D))
    layer = from_torch(module)
    assert layer.epsilon == 1e-5
    torch_parity(layer, module, rand(B, T, D, dtype=np.float32))


TORCH_MASKS = ["key-padding", "attention-mask", "both", "causal"]


@pytest.mark.parametrize("kind", TORCH_MASKS)
def test_multi_head_attention_parity(torch, kind):
    E, Tq = 8, S if kind == "causal" else T  # causal: query and key of one length
    module = randomize(torch, torch.nn.MultiheadAttention(E, H, kdim=5, vdim=6, batch_first=True))
    layer = from_torch(module)
    pad = np.array([[1, 1, 0, 1], [1, 1, 1, 0]], bool)
    attn = rand(Tq, S, seed=4) > -0.5
    attn[:, 0] = True  # torch gives NaN for rows with nothing to attend to
    ours, theirs = {}, {}
    if kind in ("key-padding", "both"):
        ours["key_padding_mask"], theirs["key_padding_mask"] = pad, torch.tensor(~pad)
    if kind in ("attention-mask", "both"):
        ours["attention_mask"], theirs["attn_mask"] = attn, torch.tensor(~attn)
    if kind == "causal":
        ours["use_causal_mask"] = True
        theirs.update(attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(S), is_causal=True)
    inputs = [rand(B, Tq, E, seed=1, dtype=np.float32), rand(B, S, 6, seed=2, dtype=np.float32),
              rand(B, S, 5, seed=3, dtype=np.float32)]  # [query, value, key]
    torch_parity(layer, module, inputs, call=lambda l, x: l(x, training=True, **ours),
                 torch_call=lambda m, t: m(t[0], t[2], t[1], need_weights=False, **theirs)[0])
    _, weights = layer(inputs, return_attention_scores=True, **ours)
    _, torch_weights = module(*(torch.tensor(inputs[i]) for i in (0, 2, 1)), average_attn_weights=False, **theirs)
    assert weights.shape == (B, H, Tq, S)
    assert_close(weights, torch_weights.detach().numpy(), atol=1e-6, what="per-head weights")


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_parity(torch, norm_first, activation):
    module = randomize(torch, torch.nn.TransformerEncoderLayer(8, H, 16, dropout=0.0, activation=activation,
                                                               batch_first=True, norm_first=norm_first))
    layer = from_torch(module)
    pad = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
    torch_parity(layer, module, [rand(B, S, 8, dtype=np.float32)],
                 call=lambda l, x: l(x[0], training=True, padding_mask=pad),
                 torch_call=lambda m, t: m(t[0], src_key_padding_mask=torch.tensor(~pad)))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_layer_inference_parity_with_torch_fast_path(torch, norm_first):
    module = randomize(torch, torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True,
                                                               norm_first=norm_first)).eval()
    layer = from_torch(module)
    x = rand(3, 40, 16, seed=5, dtype=np.float32)
    pad = np.arange(40)[None, :] < np.array([40, 17, 1])[:, None]
    with torch.inference_mode():
        want = module(torch.tensor(x), src_key_padding_mask=torch.tensor(~pad)).numpy()
    got = layer(x, padding_mask=pad)
    want[~pad] = got[~pad] = 0  # torch's fast path returns zeros at padded positions (nested tensors)
    assert_close(got, want, atol=1e-5, what="inference output")


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_decoder_layer_parity(torch, norm_first):
    module = randomize(torch, torch.nn.TransformerDecoderLayer(8, H, 16, dropout=0.0, activation="gelu",
                                                               batch_first=True, norm_first=norm_first))
    layer = from_torch(module)
    memory_pad = np.array([[1, 1, 1, 1], [1, 0, 1, 0]], bool)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(T)
    torch_parity(layer, module, [rand(B, T, 8, seed=1, dtype=np.float32), rand(B, S, 8, seed=2, dtype=np.float32)],
                 call=lambda l, x: l(x, training=True, encoder_padding_mask=memory_pad),
                 torch_call=lambda m, t: m(t[0], t[1], tgt_mask=causal, tgt_is_causal=True,
                                           memory_key_padding_mask=torch.tensor(~memory_pad)))


def test_stack_parity_and_round_trip(torch):
    encoder = randomize(torch, torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, H, 16, dropout=0.0, batch_first=True, norm_first=True), 2,
        enable_nested_tensor=False))
    decoder = randomize(torch, torch.nn.TransformerDecoder(
        torch.nn.TransformerDecoderLayer(8, H, 16, dropout=0.0, batch_first=True), 2))
    x, memory = rand(B, T, 8, seed=1, dtype=np.float32), rand(B, S, 8, seed=2, dtype=np.float32)
    stack = from_torch(encoder)
    torch_parity(stack, encoder, [x], call=lambda l, xs: l(xs[0], training=True))
    causal = torch.nn.Transformer.generate_square_subsequent_mask(T)
    torch_parity(from_torch(decoder), decoder, [x, memory],
                 torch_call=lambda m, t: m(t[0], t[1], tgt_mask=causal, tgt_is_causal=True))
    back = to_torch(stack)
    assert back.layers[0] is not back.layers[1]
    with torch.no_grad():
        assert_close(stack(x), back(torch.tensor(x)), atol=1e-5, what="encoder stack")


def test_to_torch_round_trips(torch):
    x = rand(B, T, 8, dtype=np.float32)
    enc = layers.TransformerEncoderLayer(H, 16, norm_first=True)
    dec = layers.TransformerDecoderLayer(H, 16, activation="gelu")
    mha = layers.MultiHeadAttention(H, 4)
    norm = layers.LayerNormalization(epsilon=1e-5)
    y_enc, y_dec, y_mha, y_norm = enc(x), dec([x, x]), mha(x, x, use_causal_mask=True), norm(x)
    for layer in (enc, dec, mha, norm):
        for p in layer.params.values():  # non-trivial biases and norms
            p += rand(*p.shape, seed=p.size, dtype=np.float32) * 0.1
    y_enc, y_dec, y_mha, y_norm = enc(x), dec([x, x]), mha(x, x, use_causal_mask=True), norm(x)
    tx = torch.tensor(x)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(T)
    with torch.no_grad():
        assert_close(y_enc, to_torch(enc).eval()(tx), atol=1e-5, what="encoder")
        assert_close(y_dec, to_torch(dec).eval()(tx, tx, tgt_mask=causal, tgt_is_causal=True), atol=1e-5,
                     what="decoder")
        assert_close(y_mha, to_torch(mha)(tx, tx, tx, attn_mask=causal, need_weights=False)[0], atol=1e-5,
                     what="attention")
        assert_close(y_norm, to_torch(norm)(tx), atol=1e-5, what="layernorm")
    again = from_torch(to_torch(enc))
    for name, p in enc.params.items():
        assert_close(again.params[name], p, atol=0, what=name)


# ----------------------------------------------------------------------------- layers called more than once
def random_upstream(outputs, seed):
    """A random gradient for each array output (the attention weights included); None for lists
    of weights, which the stacks take no gradient for."""
    rng = np.random.default_rng(seed)
    if isinstance(outputs, np.ndarray):
        return rng.standard_normal(outputs.shape)
    return [rng.standard_normal(o.shape) if isinstance(o, np.ndarray) else None for o in outputs]


def assert_same_gradients(got, want, what):
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{what}: {got!r} vs {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_gradients(g, w, f"{what}[{i}]")
    elif want is None:
        assert got is None, f"{what}: expected None"
    else:
        assert_close(got, want, atol=1e-12, what=what)


def check_calls_add_up(make, calls):
    """Applies one layer to each call's ``(args, kwargs)`` in turn, then backpropagates the calls'
    caches in reverse order: its parameter gradients must be the sum of fresh copies' (same
    weights, one call each), and each call must get its own outputs and input gradients."""
    shared = make()
    runs = [shared.apply(*args, training=True, **kwargs) for args, kwargs in calls]
    upstream = [random_upstream(outputs, seed=i) for i, (outputs, _) in enumerate(runs)]
    shared.zero_grad()
    input_grads = [shared.backprop(cache, dy) for (_, cache), dy in reversed(list(zip(runs, upstream)))][::-1]
    summed = {name: np.zeros_like(g) for name, g in shared.grads.items()}
    for i, ((args, kwargs), (outputs, _), dy) in enumerate(zip(calls, runs, upstream)):
        fresh = make()
        fresh.apply(*args, **kwargs)  # builds it
        fresh.set_weights(shared.get_weights())
        fresh_outputs, cache = fresh.apply(*args, training=True, **kwargs)
        assert_same_gradients(fresh_outputs, outputs, f"call {i} outputs")
        assert_same_gradients(fresh.backprop(cache, dy), input_grads[i], f"call {i} input gradients")
        for name, g in fresh.grads.items():
            summed[name] += g
    for name, g in shared.grads.items():
        assert_close(g, summed[name], atol=1e-12, what=f"gradient of {name}")


def encoder_calls():
    return [((rand(B, T, D, seed=1),), {"padding_mask": np.array([2, 3])}),
            ((rand(3, 5, D, seed=2),), {"attention_mask": np.tril(np.ones((5, 5), np.int64)),
                                        "padding_mask": np.array([[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]], bool)})]


def decoder_calls():
    return [(([rand(B, T, D, seed=1), rand(B, S, 6, seed=2)],), {"encoder_padding_mask": np.array([4, 1])}),
            (([rand(3, 5, D, seed=3), rand(3, 2, 6, seed=4)],),
             {"decoder_padding_mask": np.array([5, 2, 1]), "encoder_attention_mask": rand(5, 2, seed=5) > -0.5,
              "use_causal_mask": False})]


SHARED_CASES = {
    "layernorm": (lambda: layers.LayerNormalization(dtype="float64"),
                  [((rand(B, T, D, seed=1),), {}), ((rand(3, 5, D, seed=2),), {})]),
    "sinusoidal": (lambda: layers.PositionalEncoding(dtype="float64"),
                   [((rand(B, T, D, seed=1),), {}), ((rand(3, 5, D, seed=2),), {})]),
    "learned-positions": (lambda: layers.PositionEmbedding(6, dtype="float64"),
                          [((rand(B, T, D, seed=1),), {}), ((rand(3, 5, D, seed=2),), {})]),
    "feed-forward": (lambda: layers.FeedForward(6, activation="gelu", dtype="float64"),
                     [((rand(B, T, D, seed=1),), {}), ((rand(3, 5, D, seed=2),), {})]),
    "self-attention": (lambda: layers.MultiHeadAttention(H, 3, dtype="float64"),
                       [((rand(B, T, D, seed=1),) * 2, {"key_padding_mask": np.array([3, 1]),
                                                         "return_attention_scores": True}),
                        ((rand(3, 5, D, seed=2),) * 2, {"use_causal_mask": True,
                                                         "attention_mask": rand(5, 5, seed=3) > 0})]),
    "cross-attention": (lambda: layers.MultiHeadAttention(H, 3, value_dim=2, output_shape=5, dtype="float64"),
                        [(([rand(B, T, D, seed=1), rand(B, S, 6, seed=2), rand(B, S, 3, seed=3)],),
                          {"attention_mask": rand(B, T, S, seed=4) > 0}),
                         (([rand(3, 2, D, seed=5), rand(3, 6, 6, seed=6), rand(3, 6, 3, seed=7)],),
                          {"key_padding_mask": np.array([6, 0, 2])})]),
    "encoder-layer": (lambda: layers.TransformerEncoderLayer(H, 5, dtype="float64"), encoder_calls()),
    "encoder-layer-pre-norm": (lambda: layers.TransformerEncoderLayer(H, 5, norm_first=True, dtype="float64"),
                               encoder_calls()),
    "decoder-layer": (lambda: layers.TransformerDecoderLayer(H, 5, dtype="float64"), decoder_calls()),
    "decoder-layer-pre-norm": (lambda: layers.TransformerDecoderLayer(H, 5, norm_first=True, dtype="float64"),
                               decoder_calls()),
    "encoder-three-calls": (lambda: layers.TransformerEncoder(2, H, 5, dtype="float64"),
                            encoder_calls() + [((rand(1, 4, D, seed=9),), {"use_causal_mask": True})]),
    "decoder": (lambda: layers.TransformerDecoder(2, H, 5, norm_first=True, dtype="float64"), decoder_calls()),
}


@pytest.mark.parametrize("make, calls", SHARED_CASES.values(), ids=SHARED_CASES.keys())
def test_a_layer_called_several_times_gets_each_calls_gradients(make, calls):
    check_calls_add_up(make, calls)


def test_encoder_layer_returning_weights_takes_no_weight_gradient_per_call():
    layer = layers.TransformerEncoderLayer(H, 5, dtype="float64")
    x = rand(B, T, D)
    (y, weights), cache = layer.apply(x, return_attention_scores=True, training=True)
    assert weights.shape == (B, H, T, T)
    dy = rand(B, T, D, seed=1)
    assert_close(layer.backprop(cache, (dy, None)), layer.backprop(layer.apply(x, training=True)[1], dy),
                 atol=1e-12, what="dinputs")
    with pytest.raises(ValueError, match=r"\(doutput, None\)"):
        layer.backprop(cache, (dy, weights))


INPUT_GRADIENT_CASES = {
    "feed-forward": (lambda: layers.FeedForward(6, dtype="float64"), (rand(B, T, D),)),
    "attention": (lambda: layers.MultiHeadAttention(H, 3, dtype="float64"), (rand(B, T, D), rand(B, S, D))),
    "learned-positions": (lambda: layers.PositionEmbedding(6, dtype="float64"), (rand(B, T, D),)),
    "encoder": (lambda: layers.TransformerEncoder(2, H, 5, dtype="float64"), (rand(B, T, D),)),
    "decoder-layer": (lambda: layers.TransformerDecoderLayer(H, 5, dtype="float64"),
                      ([rand(B, T, D), rand(B, S, D)],)),
}


@pytest.mark.parametrize("make, args", INPUT_GRADIENT_CASES.values(), ids=INPUT_GRADIENT_CASES.keys())
def test_input_gradient_skipped_when_not_needed_with_the_same_weight_gradients(make, args):
    # what a model does for a layer fed only by its inputs
    needed, skipped = make(), make()
    outputs, cache = needed.apply(*args, training=True)
    skipped.apply(*args)
    skipped.set_weights(needed.get_weights())
    dy = random_upstream(outputs, seed=1)
    dinputs = needed.backprop(cache, dy)
    skipped_dinputs = skipped.backprop(skipped.apply(*args, training=True)[1], dy, need_dx=False)
    if isinstance(skipped, layers.TransformerDecoderLayer):  # the memory's gradient is still needed
        assert skipped_dinputs[0] is None
        assert_close(skipped_dinputs[1], dinputs[1], atol=1e-12, what="dmemory")
    else:
        assert skipped_dinputs is None
    for name, g in needed.grads.items():
        assert_close(skipped.grads[name], g, atol=1e-12, what=f"gradient of {name}")


# ----------------------------------------------------------------------------- behaviour
def test_fully_masked_queries_give_zero_weights_not_nan():
    layer = layers.MultiHeadAttention(H, 2)
    x = rand(B, T, D, dtype=np.float32)
    mask = np.ones((B, T, T), bool)
    mask[0, 1] = False  # query 1 of row 0 may attend to nothing
    y, w = layer(x, x, attention_mask=mask, key_padding_mask=np.array([0, 3]), return_attention_scores=True)
    assert np.all(np.isfinite(y)) and np.all(w[0] == 0)
    enc = layers.TransformerEncoderLayer(H, 8)
    assert np.all(np.isfinite(enc(x, padding_mask=np.array([0, 2]), training=True)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_inference_path_matches_the_training_path(dtype, norm_first, activation):
    # training=False runs other kernels: attention without weights (unless returned), the
    # feed-forward in row blocks without its hidden activations
    kw = dict(num_heads=H, intermediate_dim=24, activation=activation, norm_first=norm_first, dtype=dtype)
    enc, dec = layers.TransformerEncoderLayer(**kw), layers.TransformerDecoderLayer(**kw)
    x, memory = rand(3, 7, 8, seed=1, dtype=dtype), rand(3, 5, 6, seed=2, dtype=dtype)
    pad, memory_pad = np.array([7, 2, 0]), np.array([5, 1, 3])
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for causal in (False, True):
        want, want_w = enc(x, padding_mask=pad, use_causal_mask=causal, return_attention_scores=True, training=True)
        got, got_w = enc(x, padding_mask=pad, use_causal_mask=causal, return_attention_scores=True)
        assert_close(got, want, atol=tol, what="encoder output")
        assert_close(got_w, want_w, atol=tol, what="encoder weights")
        assert_close(enc(x, padding_mask=pad, use_causal_mask=causal), want, atol=tol, what="encoder, no weights")
    want = dec([x, memory], decoder_padding_mask=pad, encoder_padding_mask=memory_pad, training=True)
    got = dec([x, memory], decoder_padding_mask=pad, encoder_padding_mask=memory_pad)
    assert_close(got, want, atol=tol, what="decoder output")
    _, self_w, cross_w = dec([x, memory], encoder_padding_mask=memory_pad, return_attention_scores=True)
    assert self_w.shape == (3, H, 7, 7) and cross_w.shape == (3, H, 7, 5)
    stack = layers.TransformerEncoder(2, **{k: v for k, v in kw.items() if k != "dtype"}, dtype=dtype)
    y, weights = stack(x, padding_mask=pad, return_attention_scores=True)
    assert_close(stack(x, padding_mask=pad), y, atol=tol, what="stack without weights")
    assert len(weights) == 2 and all(w.shape == (3, H, 7, 7) for w in weights)


@pytest.mark.parametrize("activation", ["relu", "gelu", "linear"])
def test_feed_forward_inference_kernel_in_row_blocks(activation):
    # 700 rows of width 2048: the kernel splits them into blocks of 128 rows, the last partial
    ff = layers.FeedForward(2048, activation=activation, dropout=0.5, output_dim=5)
    x = rand(7, 100, 6, seed=3, dtype=np.float32)
    ff.build(x.shape)
    for name in ("intermediate/bias", "output/bias"):
        ff.params[name][...] = rand(*ff.params[name].shape, seed=4)
    got = ff(x)
    hidden = attnx.activations.get(activation)
    inner = x.astype(np.float64) @ ff.params["intermediate/kernel"] + ff.params["intermediate/bias"]
    act = {"relu": lambda z: np.maximum(z, 0), "linear": lambda z: z,
           "gelu": lambda z: z * 0.5 * (1 + np.vectorize(__import__("math").erf)(z / np.sqrt(2)))}[hidden]
    want = act(inner) @ ff.params["output/kernel"] + ff.params["output/bias"]
    assert got.shape == (7, 100, 5) and got.dtype == np.float32
    assert_close(got, want, atol=1e-4, what="feed-forward inference")


def test_dense_rows_split_across_threads_match_numpy():
    # enough rows that dense_forward splits them into blocks over the threads
    from attnx import _core
    x, kernel, bias = rand(5000, 40, seed=1), rand(40, 64, seed=2), rand(64, seed=3)
    for activation, act in (("relu", lambda z: np.maximum(z, 0)), ("tanh", np.tanh), ("linear", lambda z: z)):
        y, _ = _core.dense_forward(x, kernel, bias, activation)
        assert_close(y, act(x @ kernel + bias), atol=1e-12, what=activation)
    y, z = _core.dense_forward(x, kernel, bias, "gelu")  # gelu keeps its pre-activation apart
    assert_close(z, x @ kernel + bias, atol=1e-12, what="gelu pre-activation")


def test_lengths_and_bool_masks_agree_and_padding_is_ignored():
    layer = layers.TransformerEncoderLayer(H, 8)
    x = rand(B, T, D, dtype=np.float32)
    y1 = layer(x, padding_mask=np.array([2, 3]))
    y2 = layer(x, padding_mask=np.array([[1, 1, 0], [1, 1, 1]], bool))
    assert_close(y1, y2, atol=0)
    assert_close(layer(x, padding_mask=np.array([[1, 1, 0], [1, 1, 1]])), y1, atol=0)  # 0/1 integers
    causal = np.tril(np.ones((T, T), np.int64))
    assert_close(layer(x, attention_mask=causal), layer(x, attention_mask=causal.astype(bool)), atol=0)
    assert_close(layer(x, attention_mask=causal), layer(x, use_causal_mask=True), atol=1e-6)
    x_changed = x.copy()
    x_changed[0, 2] += 5  # a padded key: the real positions must not see it
    assert_close(layer(x_changed, padding_mask=np.array([2, 3]))[0, :2], y1[0, :2], atol=1e-6)


def test_causal_encoder_does_not_look_ahead():
    layer = layers.TransformerEncoder(2, H, 8)
    x = rand(B, 5, D, dtype=np.float32)
    x_changed = x.copy()
    x_changed[:, 3:] += 1
    y, weights = layer(x, use_causal_mask=True, return_attention_scores=True)
    assert_close(layer(x_changed, use_causal_mask=True)[:, :3], y[:, :3], atol=1e-6)
    assert len(weights) == 2 and weights[0].shape == (B, H, 5, 5)
    assert np.all(np.triu(weights[1], 1) == 0)
    assert_close(weights[1].sum(-1), np.ones((B, H, 5)), atol=1e-6)


def test_dropout_only_in_training_and_set_random_seed_repeats_it():
    layer = layers.TransformerEncoderLayer(H, 8, dropout=0.5)
    x = rand(B, T, D, dtype=np.float32)
    assert_close(layer(x), layer(x), atol=0)
    attnx.set_random_seed(3)
    a = layer(x, training=True)
    attnx.set_random_seed(3)
    assert_close(layer(x, training=True), a, atol=0)
    assert np.abs(a - layer(x)).max() > 1e-3


def test_params_are_the_sublayers_arrays_in_keras_shapes():
    dec = layers.TransformerDecoderLayer(H, 8)
    dec([rand(B, T, D, dtype=np.float32), rand(B, S, 6, dtype=np.float32)])
    assert dec.params["cross_attention/key_kernel"].shape == (6, H, D // H)
    assert dec.params["cross_attention/output_kernel"].shape == (H, D // H, D)
    assert dec.params["feed_forward/intermediate/kernel"] is dec.feed_forward.params["intermediate/kernel"]
    assert [k.split("/")[0] for k in dec.params][::4][:3] == ["self_attention", "self_attention", "norm1"]
    stack = layers.TransformerEncoder(3, H, 8)
    stack(rand(B, T, D, dtype=np.float32))
    assert stack.count_params() == 3 * stack.blocks[0].count_params()


def test_functional_model_with_keras_style_attention_trains_saves_and_loads(tmp_path):
    inputs = attnx.Input((6,), dtype="int64")
    x = layers.PositionEmbedding(6)(layers.Embedding(30, 8, mask_zero=True)(inputs))
    attended = layers.MultiHeadAttention(2, 4, value_dim=3, name="attention")(x, x)  # built symbolically
    x = layers.LayerNormalization()(layers.Add()([x, attended]))
    x = layers.TransformerEncoder(1, 2, 16)(x)
    outputs = layers.Dense(1, activation="sigmoid")(layers.GlobalAveragePooling1D()(x))
    model = attnx.Model(inputs, outputs)
    assert model.get_layer("attention").params["value_kernel"].shape == (8, 2, 3)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    ids = np.random.default_rng(0).integers(1, 30, (64, 6))
    labels = (ids[:, 0] > 15).astype(np.float32)
    history = model.fit(ids, labels, epochs=4, batch_size=16, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    model.save(tmp_path / "model")
    assert_close(attnx.models.load_model(tmp_path / "model").predict(ids), model.predict(ids), atol=0)


def test_functional_model_outputs_attention_weights():
    target, memory = attnx.Input((T, D)), attnx.Input((S, D))
    x, w_mha = layers.MultiHeadAttention(H, 2)(target, memory, return_attention_scores=True)
    x, w_enc = layers.TransformerEncoderLayer(H, 8)(x, return_attention_scores=True)
    y, w_self, w_cross = layers.TransformerDecoderLayer(H, 8)([x, memory], return_attention_scores=True)
    model = attnx.Model([target, memory], [y, w_mha, w_enc, w_self, w_cross])
    assert [t.shape for t in model.outputs[2:]] == [(None, H, T, T), (None, H, T, T), (None, H, T, S)]
    arrays = [rand(B, T, D, seed=1, dtype=np.float32), rand(B, S, D, seed=2, dtype=np.float32)]
    outs = model(arrays, training=True)
    assert outs[1].shape == (B, H, T, S) and outs[4].shape == (B, H, T, S)
    dtarget, dmemory = model.backward([np.ones_like(outs[0])] + [None] * 4)
    assert dtarget.shape == (B, T, D) and dmemory.shape == (B, S, D) and np.abs(dmemory).sum() > 0


@pytest.mark.parametrize("layer", [
    layers.LayerNormalization(epsilon=1e-5, center=False), layers.PositionalEncoding(max_wavelength=500.0),
    layers.PositionEmbedding(7), layers.FeedForward(8, activation="gelu", dropout=0.1, output_dim=3),
    layers.MultiHeadAttention(2, 3, value_dim=4, dropout=0.2, use_bias=False, output_shape=5),
    layers.TransformerEncoderLayer(2, 8, dropout=0.1, activation="gelu", norm_first=True),
    layers.TransformerDecoderLayer(2, 8, layer_norm_epsilon=1e-3), layers.TransformerEncoder(3, 2, 8),
    layers.TransformerDecoder(2, 2, 8, norm_first=True),
], ids=lambda layer: type(layer).__name__)
def test_config_round_trip(layer):
    config = layer.get_config()
    assert type(layer).from_config(config).get_config() == config


# ----------------------------------------------------------------------------- bad input
def test_embedding_size_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"embedding size 6 .* not divisible by num_heads=4"):
        layers.TransformerEncoderLayer(4, 8)(np.zeros((B, T, 6), np.float32))
    with pytest.raises(ValueError, match="not divisible by num_heads=4"):
        layers.TransformerDecoderLayer(4, 8)([np.zeros((B, T, 6), np.float32), np.zeros((B, S, 8), np.float32)])


@pytest.mark.parametrize("kwargs, error, pattern", [
    ({"key_padding_mask": np.ones((B, T), bool)}, ValueError, r"key_padding_mask.*mask of shape \(2, 4\)"),
    ({"key_padding_mask": np.ones((B, S), np.float32)}, TypeError, r"key_padding_mask.*dtype float32"),
    ({"key_padding_mask": np.array([1, 2, 3])}, ValueError, r"key_padding_mask.*lengths of shape \(2,\)"),
    ({"key_padding_mask": np.array([1, 5])}, ValueError, r"key_padding_mask.*lengths in \[0, 4\]"),
    ({"key_padding_mask": np.full((B, S), 2)}, ValueError, r"key_padding_mask.*only 0 and 1"),
    ({"attention_mask": np.ones((B, S, T), bool)}, ValueError, r"attention_mask.*\(2, 3, 4\).*got shape \(2, 4, 3\)"),
    ({"attention_mask": np.full((T, S), 0.5)}, ValueError, r"attention_mask.*float mask must hold only 0 and 1"),
])
def test_bad_attention_masks(kwargs, error, pattern):
    layer = layers.MultiHeadAttention(H, 2, name="mha")
    with pytest.raises(error, match=pattern) as info:
        layer(rand(B, T, D, dtype=np.float32), rand(B, S, D, dtype=np.float32), **kwargs)
    assert "mha" in str(info.value)


def test_bad_encoder_and_decoder_masks():
    enc = layers.TransformerEncoderLayer(H, 8)
    x = np.zeros((B, T, D), np.float32)
    with pytest.raises(ValueError, match=r"`padding_mask`.*shape \(2, 3\).*got shape \(3, 2\)"):
        enc(x, padding_mask=np.ones((T, B), bool))
    with pytest.raises(ValueError, match="`attention_mask`.*float mask must hold only 0 and 1"):
        enc(x, attention_mask=np.full((T, T), 0.5, np.float32))
    dec = layers.TransformerDecoderLayer(H, 8)
    with pytest.raises(ValueError, match=r"`encoder_padding_mask`.*shape \(2, 4\)"):
        dec([x, np.zeros((B, S, D), np.float32)], encoder_padding_mask=np.ones((B, T), bool))


def test_sequence_longer_than_learned_position_table():
    layer = layers.PositionEmbedding(4, name="pos")
    layer(np.zeros((B, 4, D), np.float32))
    with pytest.raises(ValueError, match=r"'pos'.*5 positions .*sequence_length=4"):
        layer(np.zeros((B, 5, D), np.float32))


def test_bad_shapes_and_arguments():
    mha = layers.MultiHeadAttention(H, 2)
    mha(np.zeros((B, T, D), np.float32), np.zeros((B, S, D), np.float32))
    with pytest.raises(ValueError, match=r"`value` expected shape \(2, \*, 4\), got \(2, 4, 5\)"):
        mha(np.zeros((B, T, D), np.float32), np.zeros((B, S, 5), np.float32))
    with pytest.raises(ValueError, match="share the batch"):
        mha(np.zeros((B, T, D), np.float32), np.zeros((3, S, D), np.float32))
    norm = layers.LayerNormalization()
    norm(np.zeros((B, T, 4)))
    with pytest.raises(ValueError, match=r"expected last axis of size 4"):
        norm(np.zeros((B, T, 5)))
    with pytest.raises(ValueError, match="epsilon must be positive"):
        layers.LayerNormalization(epsilon=0)
    with pytest.raises(ValueError, match=r"\[target, memory\]"):
        layers.TransformerDecoderLayer(H, 8)(np.zeros((B, T, D), np.float32))
    enc = layers.TransformerEncoderLayer(H, 8)
    enc(np.zeros((B, T, D), np.float32))
    with pytest.raises(RuntimeError, match="training=True"):
        enc.backward(np.zeros((B, T, D), np.float32))


# ----------------------------------------------------------------------------- end to end
def test_transformer_sentiment_example_learns():
    """The example's model (embedding + positions + 2 encoder layers + masked pooling), one seed,
    a few epochs: well above chance on the held-out 20% (the 5-seed run of the example reaches
    the issue's 0.78 mean)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "transformer_sentiment.py"
    spec = importlib.util.spec_from_file_location("transformer_sentiment", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    threads = attnx.backend.get_num_threads()
    attnx.set_num_threads(1)  # batches of 32 x 32 tokens: a second thread only adds overhead
    try:
        assert example.train(seed=0, epochs=4) >= 0.75
    finally:
        attnx.set_num_threads(threads)
