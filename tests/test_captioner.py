"""Show, Attend and Tell (attnx.vision.ImageCaptioner on the fused Bahdanau decoder): float64
gradients of the gate, the attention weights' input gradient, the initial state from the mean
annotation and the doubly stochastic regularization; hard attention's kernel; parity with a
PyTorch re-implementation; bad input; and the captioner trained on composed digits, which must
caption held-out images and look at the digit each word names."""
import numpy as np
import pytest

import attnx
from attnx import _core, datasets, layers, losses
from attnx.seq2seq import BahdanauDecoder, LuongDecoder
from attnx.vision import DoublyStochasticRegularization, ImageCaptioner

B, L, D, V, T = 3, 5, 6, 9, 4


def _captioner(gated=True, attention="soft", dtype="float64", seed=0):
    """A small captioner whose 'images' are (L, D0) region features and whose encoder is one Dense."""
    attnx.set_random_seed(seed)
    x = attnx.Input((L, D + 1), dtype=dtype)
    encoder = attnx.Model(x, layers.Dense(D, activation="tanh", dtype=dtype)(x))
    model = ImageCaptioner(encoder, (L, D + 1), vocab_size=V, embedding_dim=4, units=7, attention_units=5,
                           gated=gated, attention=attention, attention_regularization=0.7, max_length=6, dtype=dtype)
    rng = np.random.default_rng(seed)
    for p in model.params.values():
        p[...] = rng.normal(0, 0.5, p.shape)
    return model


def _batch(seed=1):
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(B, L, D + 1))
    tokens = np.concatenate([np.ones((B, 1), np.int64), rng.integers(3, V, (B, T - 1)), np.full((B, 1), 2)], 1)
    tokens[0, -1] = 0  # a caption one word shorter: a padded step
    return images, tokens


CE = losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0)


def _loss_and_grads(model, images, tokens):
    """The training loss (cross-entropy + doubly stochastic term) and its analytic parameter gradients."""
    inputs, targets = model.train_data(images, tokens)
    reg = DoublyStochasticRegularization(model.attention_regularization)
    model.zero_grad()
    (logits, weights), cache = model.apply(inputs, training=True)
    ce, dlogits = CE.compute(targets[0], logits)
    penalty, dweights = reg.compute(targets[1], weights)
    model.backprop(cache, [dlogits, dweights])

    def loss():
        (lg, w), _ = model.apply(inputs)
        return CE(targets[0], lg) + reg(targets[1], w)
    return ce + penalty, {k: g.copy() for k, g in model.grads.items()}, loss


@pytest.mark.parametrize("gated", [True, False])
def test_float64_gradients_of_gate_init_and_regularization(gated):
    model = _captioner(gated=gated)
    _, grads, loss = _loss_and_grads(model, *_batch())
    names = set(grads)
    assert ("decoder/gate_kernel" in names) == gated
    for name, p in model.params.items():
        numeric = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + 1e-6
            plus = loss()
            p[i] = old - 1e-6
            minus = loss()
            p[i] = old
            numeric[i] = (plus - minus) / 2e-6
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_doubly_stochastic_term_value_and_its_gradient_reach_the_weights():
    rng = np.random.default_rng(2)
    weights = rng.dirichlet(np.ones(L), size=(B, T))
    targets = np.ones((B, T), np.int64)
    targets[1, -1] = 0
    reg = DoublyStochasticRegularization(0.3)
    real = (targets != 0)[:, :, None]
    expected = 0.3 * ((1 - (weights * real).sum(1)) ** 2).sum(-1).mean()
    value, dweights = reg.compute(targets, weights)
    assert value == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(dweights, -2 * 0.3 * (1 - (weights * real).sum(1))[:, None, :] * real / B, rtol=1e-12)
    # the decoder takes a gradient of its weights (zero gradient: the same as none, bit for bit)
    model = _captioner()
    images, tokens = _batch()
    inputs, _ = model.train_data(images, tokens)
    (logits, w), cache = model.apply(inputs, training=True)
    model.zero_grad()
    model.backprop(cache, [np.ones_like(logits), None])
    without = {k: g.copy() for k, g in model.grads.items()}
    (logits, w), cache = model.apply(inputs, training=True)
    model.zero_grad()
    model.backprop(cache, [np.ones_like(logits), np.zeros_like(w)])
    for k, g in model.grads.items():
        np.testing.assert_array_equal(g, without[k], err_msg=k)


def _hard_problem(seed=3):
    attnx.set_random_seed(seed)
    dec = BahdanauDecoder(V, 4, 7, cell="lstm", attention_units=5, gated=True, hard=True, soft_fraction=0.0,
                          dtype="float64")
    dec.build([(None, None), (None, None, D), (None, 7), (None, 7)])
    dec.built = True
    rng = np.random.default_rng(seed)
    for p in dec.params.values():
        p[...] = rng.normal(0, 0.5, p.shape)
    enc = rng.normal(size=(B, L, D))
    ids = rng.integers(1, V, (B, T))
    h0, c0 = rng.normal(size=(2, B, 7))
    uniforms = rng.random((B, T))
    return dec, enc, ids, h0, c0, uniforms


def test_hard_attention_kernel_context_is_the_drawn_region_and_its_gradients_are_exact():
    dec, enc, ids, h0, c0, uniforms = _hard_problem()
    rng = np.random.default_rng(4)
    R1, R2 = rng.normal(size=(B, T, V)), rng.normal(size=(B, T, L))

    def run(enc, uniforms=uniforms):
        return _core.decoder_forward(kind="bahdanau", score="additive", cell="lstm", ids=ids, enc=enc, h0=h0, c0=c0,
                                     params=dec.params, gated=True, hard=True, uniforms=uniforms)

    logits, _, _, _, weights, _, cache = run(enc)
    positions = cache["positions"].T
    # the region drawn is the inverse CDF of the weights at the uniform
    np.testing.assert_array_equal(positions, (np.cumsum(weights, -1) <= uniforms[..., None]).sum(-1))
    # without uniforms: the most likely region
    argmax_cache = run(enc, None)[6]
    np.testing.assert_array_equal(argmax_cache["positions"].T, run(enc, None)[4].argmax(-1))
    grads = {k: np.zeros_like(p) for k, p in dec.params.items()}
    denc, dh0, dc0 = _core.decoder_backward(cache=cache, dlogits=R1, dweights=R2, enc=enc, params=dec.params,
                                            grads=grads)

    def loss(e):
        lg, _, _, _, w, _, c = run(e)
        np.testing.assert_array_equal(c["positions"].T, positions)  # the step keeps the drawn regions
        return (lg * R1).sum() + (w * R2).sum()
    numeric = np.zeros_like(enc)
    for i in np.ndindex(enc.shape):
        e = enc.copy()
        e[i] += 1e-6
        plus = loss(e)
        e[i] -= 2e-6
        numeric[i] = (plus - loss(e)) / 2e-6
    np.testing.assert_allclose(denc, numeric, rtol=1e-5, atol=1e-7)
    for name in ("score_vector", "gate_kernel", "output_kernel"):
        p, numeric = dec.params[name], np.zeros_like(dec.params[name])
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + 1e-6
            plus = loss(enc)
            p[i] = old - 1e-6
            numeric[i] = (plus - loss(enc)) / 2e-6
            p[i] = old
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_hard_attention_reinforce_gradient_and_baseline():
    dec, enc, ids, h0, c0, _ = _hard_problem()
    (logits, weights), cache = dec.apply([ids, enc, h0, c0], training=True, return_attention_scores=True)
    with pytest.raises(RuntimeError, match="set_reward"):
        dec.backprop(cache, [np.zeros_like(logits), None])
    rewards = np.array([1.0, -2.0, 0.5])
    dec.set_reward(rewards, cache)
    assert dec.baseline is None  # the first batch's baseline is its own mean reward
    grads_before = {k: g.copy() for k, g in dec.grads.items()}
    dec.backprop(cache, [np.zeros_like(logits), None])
    assert dec.baseline == pytest.approx(rewards.mean())
    # REINFORCE moves the score: its weights got a gradient although the logits' gradient was zero
    assert np.abs(dec.grads["score_vector"] - grads_before["score_vector"]).max() > 0
    positions = cache.kernel["positions"].T
    expected = np.zeros_like(weights)
    b, t = np.indices(positions.shape)
    expected[b, t, positions] = -(rewards - rewards.mean())[:, None] / (B * T * weights[b, t, positions])
    np.testing.assert_allclose(dec._reinforce_gradient(cache), expected, rtol=1e-12)
    # Xu et al.'s variance reduction: with soft_fraction = 1 every training call attends softly
    dec.soft_fraction = 1.0
    (_, soft_weights), soft_cache = dec.apply([ids, enc, h0, c0], training=True, return_attention_scores=True)
    assert soft_cache.reinforce is None and "positions" not in soft_cache.kernel
    dec.set_reward(rewards, soft_cache)  # nothing to reinforce: ignored
    dec.backprop(soft_cache, [np.ones_like(logits), None])


def test_soft_options_off_give_the_plain_bahdanau_decoder_bit_for_bit():
    attnx.set_random_seed(5)
    plain = BahdanauDecoder(V, 4, 7, cell="lstm", dtype="float32")
    gated = BahdanauDecoder(V, 4, 7, cell="lstm", gated=True, dtype="float32")
    shapes = [(None, None), (None, None, D), (None, 7), (None, 7)]
    for dec in (plain, gated):
        dec.build(shapes)
        dec.built = True
    for k, p in plain.params.items():
        gated.params[k][...] = p
    gated.params["gate_kernel"][...] = 0
    gated.params["gate_bias"][...] = 1e4  # beta = 1: the gate lets the context through unchanged
    rng = np.random.default_rng(6)
    enc = rng.normal(size=(B, L, D)).astype(np.float32)
    ids = rng.integers(1, V, (B, T))
    h0, c0 = rng.normal(size=(2, B, 7)).astype(np.float32)
    a, _ = plain.apply([ids, enc, h0, c0])
    b, _ = gated.apply([ids, enc, h0, c0])
    np.testing.assert_array_equal(a, b)


def _torch_show_attend_tell(model, images, tokens, torch):
    """Xu et al.'s decoder in PyTorch (float64), with Keras' LSTM gate order (i, f, c, o)."""
    t = {k: torch.tensor(v, requires_grad=True) for k, v in model.params.items()}
    enc_prefix = [k for k in t if k.endswith("/kernel") and not k.startswith(("init", "decoder"))][0][:-len("kernel")]
    inputs, targets = model.train_data(images, tokens)
    x = torch.tensor(inputs[0])
    ann = torch.tanh(x @ t[enc_prefix + "kernel"] + t[enc_prefix + "bias"])
    mean = ann.mean(1)
    h = torch.tanh(mean @ t["init_h/kernel"] + t["init_h/bias"])
    c = torch.tanh(mean @ t["init_c/kernel"] + t["init_c/bias"])
    keys = ann @ t["decoder/key_kernel"]
    ids = torch.tensor(inputs[1])
    H = h.shape[1]
    logits, weights = [], []
    for step in range(ids.shape[1]):
        scores = torch.tanh((h @ t["decoder/query_kernel"] + t["decoder/query_bias"])[:, None] + keys) @ t[
            "decoder/score_vector"]
        alpha = torch.softmax(scores, -1)
        context = (alpha[:, :, None] * ann).sum(1)
        if model.decoder.gated:
            context = torch.sigmoid(h @ t["decoder/gate_kernel"] + t["decoder/gate_bias"])[:, None] * context
        z = torch.cat([t["decoder/embeddings"][ids[:, step]], context], 1) @ t["decoder/kernel"] + \
            h @ t["decoder/recurrent_kernel"] + t["decoder/bias"]
        i, f, g, o = torch.sigmoid(z[:, :H]), torch.sigmoid(z[:, H:2 * H]), torch.tanh(z[:, 2 * H:3 * H]), \
            torch.sigmoid(z[:, 3 * H:])
        real = (ids[:, step] != 0)[:, None]  # a padded step keeps the state
        c_new = f * c + i * g
        h_new = o * torch.tanh(c_new)
        c, h = torch.where(real, c_new, c), torch.where(real, h_new, h)
        logits.append(h_new @ t["decoder/output_kernel"] + t["decoder/output_bias"])
        weights.append(alpha)
    logits, weights = torch.stack(logits, 1), torch.stack(weights, 1)
    y = torch.tensor(targets[0])
    real = (y != 0).double()
    ce = -(torch.log_softmax(logits, -1).gather(-1, y[..., None])[..., 0] * real).sum() / real.sum()
    coverage = (weights * real[..., None]).sum(1)
    loss = ce + model.attention_regularization * ((1 - coverage) ** 2).sum(-1).mean()
    loss.backward()
    grads = {k: v.grad.numpy() for k, v in t.items()}
    return float(loss.detach()), logits.detach().numpy(), weights.detach().numpy(), grads


@pytest.mark.parametrize("gated", [True, False])
def test_parity_with_pytorch_show_attend_tell(gated):
    torch = pytest.importorskip("torch")
    model = _captioner(gated=gated)
    images, tokens = _batch()
    loss, grads, _ = _loss_and_grads(model, images, tokens)
    inputs, _ = model.train_data(images, tokens)
    (logits, weights), _ = model.apply(inputs)
    t_loss, t_logits, t_weights, t_grads = _torch_show_attend_tell(model, images, tokens, torch)
    real = tokens[:, 1:] != 0
    np.testing.assert_allclose(logits[real], t_logits[real], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(weights, t_weights, rtol=1e-5, atol=1e-5)
    assert loss == pytest.approx(t_loss, rel=1e-5)
    for k, g in grads.items():
        np.testing.assert_allclose(g, t_grads[k], rtol=1e-5, atol=1e-5, err_msg=k)


def test_bad_input():
    x = attnx.Input((L, D))
    encoder = attnx.Model(x, layers.Dense(D)(x))
    with pytest.raises(ValueError, match="annotations"):  # rank 2: not (batch, regions, features)
        ImageCaptioner(attnx.Model(x, layers.GlobalAveragePooling1D()(x)), (L, D), vocab_size=V)
    with pytest.raises(TypeError, match="encoder"):
        ImageCaptioner(np.zeros(3), (L, D), vocab_size=V)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="attention_regularization"):
            ImageCaptioner(encoder, (L, D), vocab_size=V, attention_regularization=bad)
        with pytest.raises(ValueError, match="strength"):
            DoublyStochasticRegularization(bad)
    with pytest.raises(ValueError, match="'soft' or 'hard'"):
        ImageCaptioner(encoder, (L, D), vocab_size=V, attention="medium")
    with pytest.raises(ValueError, match="vocab_size"):
        ImageCaptioner(encoder, (L, D))
    model = ImageCaptioner(encoder, (L, D), vocab_size=V, max_length=4)
    with pytest.raises(ValueError, match="images expected shape"):
        model.greedy_caption(np.zeros((2, L, D + 1), np.float32))
    with pytest.raises(ValueError, match="start token"):
        model.train_data(np.zeros((1, L, D), np.float32), np.array([[3, 4, 2]]))
    with pytest.raises(ValueError, match="max_length"):
        model.train_data(np.zeros((1, L, D), np.float32), np.array([[1, 3, 3, 3, 3, 2]]))
    # the decoder's annotation size is fixed when it is built
    dec = model.decoder
    with pytest.raises(ValueError):
        dec.apply([np.ones((2, 3), np.int64), np.zeros((2, L, D + 2), np.float32), np.zeros((2, dec.units),
                   np.float32), np.zeros((2, dec.units), np.float32)])
    with pytest.raises(ValueError, match="Bahdanau"):
        LuongDecoder(V, 4, 7, gated=True)
    with pytest.raises(ValueError, match="baseline_decay"):
        BahdanauDecoder(V, 4, 7, hard=True, baseline_decay=1.0)
    with pytest.raises(ValueError, match="soft_fraction"):
        BahdanauDecoder(V, 4, 7, hard=True, soft_fraction=1.5)
    dec_hard, enc, ids, h0, c0, uniforms = _hard_problem()
    args = dict(kind="bahdanau", score="additive", cell="lstm", ids=ids, enc=enc, h0=h0, c0=c0, params=dec_hard.params,
                gated=True)
    with pytest.raises(ValueError, match="hard=True"):
        _core.decoder_forward(**args, uniforms=uniforms)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        _core.decoder_forward(**args, hard=True, uniforms=uniforms + 1)
    with pytest.raises(ValueError, match="uniforms"):
        _core.decoder_forward(**args, hard=True, uniforms=uniforms[:, :2])
    with pytest.raises(ValueError, match="Bahdanau options"):
        _core.decoder_forward(**{**args, "kind": "luong", "score": "general"})
    cache = _core.decoder_forward(**args, hard=True)[6]
    grads = {k: np.zeros_like(p) for k, p in dec_hard.params.items()}
    with pytest.raises(ValueError, match="dweights"):
        _core.decoder_backward(cache=cache, dlogits=np.zeros((B, T, V)), dweights=np.zeros((B, T, L + 1)), enc=enc,
                               params=dec_hard.params, grads=grads)
    del args["params"]
    with pytest.raises(ValueError, match="gate_kernel"):
        _core.decoder_forward(**args, params={k: v for k, v in dec_hard.params.items() if k != "gate_kernel"})


def test_hard_captioner_trains_through_fit_with_the_caption_log_likelihood_as_reward():
    model = _captioner(attention="hard", dtype="float32")
    model.decoder.soft_fraction = 0.0  # every batch draws regions
    images, tokens = _batch()
    model.compile(optimizer=attnx.optimizers.SGD(0.1))
    before = model.decoder.params["score_vector"].copy()
    history = model.fit(images.astype(np.float32), tokens, epochs=2, batch_size=B, verbose=0)
    assert np.isfinite(history.history["loss"]).all() and model.decoder.baseline is not None
    assert np.abs(model.decoder.params["score_vector"] - before).max() > 0
    inputs, _ = model.train_data(images.astype(np.float32), tokens)
    with pytest.raises(ValueError, match="target ids"):  # the reward needs the targets
        model.apply(inputs[:2], training=True)
    tokens_out, attention = model.predict(images.astype(np.float32))
    assert tokens_out.shape == (B, 6) and attention.shape == (B, 6, L)


def test_save_and_load_keep_the_captions(tmp_path):
    model = _captioner(dtype="float32")
    images, _ = _batch()
    before = model.greedy_caption(images.astype(np.float32))
    model.save(tmp_path / "captioner.attnx")
    loaded = attnx.load_model(tmp_path / "captioner.attnx")
    assert isinstance(loaded, ImageCaptioner) and loaded.decoder.gated
    after = loaded.greedy_caption(images.astype(np.float32))
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


# ------------------------------------------------------------------------------ trained on digits
# A small CNN encoder: 8x8 convolutions (a digit's size) every 2 pixels, then 3x3 max pooling every
# 2, leave a 2 x 10 feature map whose cells see 12x12 pixels every 4 and answer to a digit anywhere
# inside them; a learned embedding of each region's place lets the decoder go from left to right.
CANVAS, GRID, REGION, STRIDE = (16, 48), (2, 10), 12, 4
FILTERS = 256


def _cnn_encoder():
    x = attnx.Input(CANVAS + (1,))
    h = layers.Conv2D(FILTERS, 8, strides=2, activation="relu", kernel_initializer="he_uniform")(x)
    h = layers.MaxPooling2D(3, strides=2)(h)
    h = layers.Dense(64, activation="relu")(layers.Reshape((GRID[0] * GRID[1], FILTERS))(h))
    return attnx.Model(x, layers.PositionEmbedding(GRID[0] * GRID[1])(h))


def _train_on_fresh_compositions(model, epochs, decay_from):
    """Each epoch on 6000 new images (compositions are free); the learning rate times 0.6 per epoch
    from epoch `decay_from`."""
    for epoch in range(epochs):
        if epoch >= decay_from:
            model.optimizer.learning_rate *= 0.6
        data = attnx.datasets.load_digit_captions(6000, canvas=CANVAS, seed=100 + epoch)
        model.fit(data.images, data.tokens, epochs=1, batch_size=64, verbose=0)


@pytest.mark.slow
def test_soft_captioner_captions_held_out_images_and_looks_at_each_digit():
    attnx.set_random_seed(0)
    test = attnx.datasets.load_digit_captions(500, canvas=CANVAS, seed=1)
    model = ImageCaptioner(_cnn_encoder(), CANVAS + (1,), vocabulary=test.vocabulary, embedding_dim=32,
                           units=128, max_length=5)
    model.compile(optimizer=attnx.optimizers.Adam(3e-3))
    _train_on_fresh_compositions(model, epochs=10, decay_from=8)
    tokens, attention = model.greedy_caption(test.images)
    exact = (tokens[:, :4] == test.tokens[:, 1:]).all(1).mean()
    on_digit = (datasets.attended_box(attention[:, :3], test.boxes, GRID, REGION, STRIDE) == np.arange(3)).mean()
    assert exact >= 0.95, exact  # measured 0.966 (0.976 after 12 epochs)
    assert on_digit >= 0.90, on_digit  # measured 0.999
    words, weights = model.caption(test.images[:1])[0]
    assert " ".join(words) == test.captions[0] and weights.shape == (3, GRID[0] * GRID[1])
    beams = model.beam_caption(test.images[:1], width=3)[0]
    assert beams[0].tokens == list(test.tokens[0, 1:4]) and beams[0].attention.shape == (4, GRID[0] * GRID[1])
