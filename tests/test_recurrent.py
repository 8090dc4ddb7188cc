"""Recurrent layers: parity with torch.nn.RNN/GRU/LSTM (packed sequences, bidirectional, stacked,
initial states), float64 gradient checks of every cell and option, masking semantics, Keras
weight order, cells, and bad input."""
import numpy as np
import pytest

import attnx
from attnx.interop import from_torch, to_torch, torch_grads
from attnx.layers import (GRU, LSTM, Bidirectional, Dense, Embedding, GRUCell, LSTMCell, SimpleRNN,
                          SimpleRNNCell)
from attnx.testing import assert_close, gradcheck

KINDS = {"RNN": SimpleRNN, "GRU": GRU, "LSTM": LSTM}


# ------------------------------------------------------------------------ torch parity
@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_parity_with_torch_packed(torch, kind, bidirectional, num_layers):
    """Outputs, final states and gradients of inputs, initial states and parameters against
    torch with pack_padded_sequence (float32, 1e-5 absolute)."""
    rng = np.random.default_rng(hash((kind, bidirectional, num_layers)) % 2**32)
    B, T, C, H = 4, 7, 5, 6
    dirs = 2 if bidirectional else 1
    module = getattr(torch.nn, kind)(C, H, num_layers=num_layers, batch_first=True, bidirectional=bidirectional)
    layer = from_torch(module)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    lengths = np.array([7, 3, 1, 5])
    n_states = 2 if kind == "LSTM" else 1
    states_t = [torch.tensor(rng.standard_normal((num_layers * dirs, B, H)).astype(np.float32), requires_grad=True)
                for _ in range(n_states)]

    # attnx states: per direction, (B, H) for one level else (L, B, H)
    def ours(s, d):
        a = s.detach().numpy()[d::dirs]
        return a[0] if num_layers == 1 else a
    init = [ours(s, d) for d in range(dirs) for s in states_t]
    out = layer([x] + init, training=True, lengths=lengths)

    xt = torch.tensor(x, requires_grad=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(xt, torch.tensor(lengths), batch_first=True,
                                                     enforce_sorted=False)
    po, hn = module(packed, tuple(states_t) if kind == "LSTM" else states_t[0])
    y_t, _ = torch.nn.utils.rnn.pad_packed_sequence(po, batch_first=True, total_length=T)
    finals_t = list(hn) if kind == "LSTM" else [hn]

    assert_close(out[0], y_t.detach().numpy(), 1e-5, what="output")
    ours_finals = out[1:]
    for d in range(dirs):
        for i in range(n_states):
            assert_close(ours_finals[d * n_states + i], ours(finals_t[i], d), 1e-5, what=f"final state {d},{i}")

    upstream = [rng.standard_normal(np.shape(o)).astype(np.float32) for o in out]
    layer.zero_grad()
    grads = layer.backward(upstream)
    # torch: the same upstream on the padded output and on h_n (c_n) in torch's layout
    t_up_states = []
    for i in range(n_states):
        full = np.empty((num_layers * dirs, B, H), np.float32)
        for d in range(dirs):
            u = upstream[1 + d * n_states + i]
            full[d::dirs] = u if num_layers > 1 else u[None]
        t_up_states.append(torch.from_numpy(full))
    torch.autograd.backward([y_t] + finals_t, [torch.from_numpy(upstream[0])] + t_up_states)

    assert_close(grads[0], xt.grad.numpy(), 1e-5, what="dx")
    for d in range(dirs):
        for i in range(n_states):
            assert_close(grads[1 + d * n_states + i], ours(states_t[i].grad, d), 1e-5, what=f"d state {d},{i}")
    for name, g in torch_grads(module, layer).items():
        assert_close(layer.grads[name], g, 1e-5, what=f"d {name}")


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_parity_unmasked_last_output_and_relu(torch, kind):
    """return_sequences=False without a mask is torch's output[:, -1] (SimpleRNN with relu)."""
    extra = {"nonlinearity": "relu"} if kind == "RNN" else {}
    module = getattr(torch.nn, kind)(3, 5, batch_first=True, **extra)
    layer = from_torch(module)
    layer.return_sequences, layer.return_state = False, False
    x = np.random.default_rng(1).standard_normal((2, 4, 3)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    y_t = module(xt)[0][:, -1]
    y = layer(x, training=True)
    assert_close(y, y_t.detach().numpy(), 1e-5)
    dy = np.ones_like(y)
    dx = layer.backward(dy)
    y_t.backward(torch.from_numpy(dy))
    assert_close(dx, xt.grad.numpy(), 1e-5, what="dx")


def test_go_backwards_is_torch_on_flipped_input(torch):
    module = torch.nn.LSTM(3, 4, batch_first=True)
    layer = from_torch(module)
    layer.go_backwards, layer.return_state = True, False
    x = np.random.default_rng(2).standard_normal((2, 5, 3)).astype(np.float32)
    y_t = module(torch.from_numpy(x).flip(1))[0]
    assert_close(layer(x), y_t.detach().numpy(), 1e-5)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_to_torch_round_trip(torch, kind, bidirectional):
    layer = KINDS[kind](4, num_layers=2, return_sequences=True)
    if bidirectional:
        layer = Bidirectional(layer)
    x = np.random.default_rng(3).standard_normal((2, 5, 3)).astype(np.float32)
    y = layer(x)
    module = to_torch(layer)
    assert module.bidirectional == bidirectional and module.num_layers == 2
    assert_close(y, module(torch.from_numpy(x))[0].detach().numpy(), 1e-5)


# ------------------------------------------------------------------------ gradient checks
def _f64(cls, units=3, **kw):
    return cls(units, dtype="float64", **kw)


def _x(B=2, T=4, C=3, seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, C))


POST_PAD = np.array([[True, True, True, True], [True, True, False, False]])
PRE_PAD = np.array([[False, True, True, True], [False, False, True, True]])

GRAD_CASES = {
    "simple tanh": (SimpleRNN, {}),
    "simple relu": (SimpleRNN, {"activation": "relu"}),
    "gru reset_after": (GRU, {}),
    "gru classic": (GRU, {"reset_after": False}),
    "gru no bias": (GRU, {"use_bias": False}),
    "lstm": (LSTM, {}),
    "lstm hard gates": (LSTM, {"recurrent_activation": "tanh", "activation": "relu"}),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
@pytest.mark.parametrize("mask", [None, "post", "pre"])
def test_gradcheck_sequence_masks(case, mask):
    cls, kw = GRAD_CASES[case]
    layer = _f64(cls, return_sequences=True, **kw)
    m = {None: None, "post": POST_PAD, "pre": PRE_PAD}[mask]
    gradcheck(layer, _x(), call_kwargs={"mask": m} if m is not None else None)


@pytest.mark.parametrize("cls,kw", [(SimpleRNN, {}), (GRU, {"reset_after": False}), (GRU, {}), (LSTM, {})])
def test_gradcheck_initial_state_return_state_go_backwards(cls, kw):
    layer = _f64(cls, return_state=True, go_backwards=True, **kw)
    n = len(layer.state_size)
    states = [np.random.default_rng(i + 5).standard_normal((2, 3)) for i in range(n)]
    gradcheck(layer, [_x()] + states, call_kwargs={"mask": PRE_PAD})


@pytest.mark.parametrize("cls,kw", [(SimpleRNN, {}), (GRU, {"reset_after": False}), (GRU, {}), (LSTM, {})])
def test_gradcheck_dropout_fixed_masks_and_stacking(cls, kw):
    layer = _f64(cls, dropout=0.3, recurrent_dropout=0.4, num_layers=2, stack_dropout=0.25, return_sequences=True,
                 **kw)
    layer.seed_generator.next_key = lambda: 7  # the same masks on every forward pass
    y = layer(_x(), training=True)
    assert np.any(y != layer(_x(), training=False))  # dropout is active in training only
    gradcheck(layer, _x(), call_kwargs={"lengths": np.array([4, 2])})


@pytest.mark.parametrize("merge_mode", ["concat", "sum", "mul", "ave", None])
def test_gradcheck_bidirectional_merge_modes(merge_mode):
    layer = Bidirectional(_f64(GRU, return_sequences=True), merge_mode=merge_mode)
    gradcheck(layer, _x(), call_kwargs={"mask": POST_PAD})


@pytest.mark.parametrize("cls", [SimpleRNN, GRU, LSTM])
def test_gradcheck_bidirectional_stacked_states(cls):
    layer = Bidirectional(_f64(cls, num_layers=2, return_state=True))
    n = 2 * len(layer.forward_layer.state_size)
    states = [np.random.default_rng(i).standard_normal((2, 2, 3)) for i in range(n)]
    gradcheck(layer, [_x()] + states, call_kwargs={"mask": PRE_PAD})


@pytest.mark.parametrize("cls,kw", [(SimpleRNNCell, {}), (GRUCell, {}), (GRUCell, {"reset_after": False}),
                                    (LSTMCell, {})])
def test_gradcheck_cells(cls, kw):
    cell = cls(3, dtype="float64", **kw)
    x = np.random.default_rng(0).standard_normal((2, 4))
    states = [np.random.default_rng(i + 1).standard_normal((2, 3)) for i in range(len(cell.state_size))]
    gradcheck(cell, [x] + states)
    gradcheck(cell, x)  # zero initial state, dx only


# ------------------------------------------------------------------------ semantics
@pytest.mark.parametrize("cls", [SimpleRNN, GRU, LSTM])
def test_padding_carries_state_and_outputs_zeros(cls):
    """Post- and pre-padded rows give the unpadded sequence's outputs at the real steps and zeros
    elsewhere; the final state is the one after the last real step."""
    layer = cls(4, return_sequences=True, return_state=True, zero_output_for_mask=True)
    x = np.random.default_rng(0).standard_normal((1, 3, 2)).astype(np.float32)
    ref = layer(x)
    pad = np.zeros((1, 2, 2), np.float32)
    post = layer(np.concatenate([x, pad + 9], 1), mask=np.array([[1, 1, 1, 0, 0]], bool))
    pre = layer(np.concatenate([pad + 9, x], 1), mask=np.array([[0, 0, 1, 1, 1]], bool))
    assert_close(post[0][:, :3], ref[0], 1e-6)
    assert_close(pre[0][:, 2:], ref[0], 1e-6)
    assert not post[0][:, 3:].any() and not pre[0][:, :2].any()
    for a, b, r in zip(post[1:], pre[1:], ref[1:]):
        assert_close(a, r, 1e-6)
        assert_close(b, r, 1e-6)


def test_bidirectional_backward_direction_reads_real_tokens_in_reverse():
    layer = Bidirectional(LSTM(3, return_sequences=True), merge_mode=None)
    x = np.random.default_rng(0).standard_normal((1, 3, 2)).astype(np.float32)
    _, ref_b = layer(x)
    pad = np.full((1, 2, 2), 5.0, np.float32)
    _, post_b = layer(np.concatenate([x, pad], 1), lengths=np.array([3]))
    _, pre_b = layer(np.concatenate([pad, x], 1), mask=np.array([[0, 0, 1, 1, 1]], bool))
    assert_close(post_b[:, :3], ref_b, 1e-6)
    assert_close(pre_b[:, 2:], ref_b, 1e-6)
    # the backward output at the first token has seen the whole sequence
    assert not np.allclose(ref_b[:, 0], 0)


def test_fully_masked_row_gives_zeros_and_initial_state():
    layer = GRU(3, return_sequences=True, return_state=True)
    x = np.ones((2, 4, 2), np.float32)
    h0 = np.full((2, 3), 0.5, np.float32)
    y, h = layer(x, mask=np.array([[0, 0, 0, 0], [1, 1, 0, 0]], bool), initial_state=[h0])
    assert not y[0].any() and np.all(np.isfinite(y))
    assert_close(h[0], h0[0], 0)


def test_compute_mask_and_embedding_mask_zero():
    emb = Embedding(10, 4, mask_zero=True)
    ids = np.array([[3, 4, 0, 0], [5, 0, 0, 0]])
    seq = LSTM(3, return_sequences=True)
    mask = emb.compute_mask(ids)
    y = seq(emb(ids), mask=mask)
    assert seq.compute_mask(None, mask) is mask
    assert LSTM(3).compute_mask(None, mask) is None
    assert_close(y, seq(emb(ids), lengths=np.array([2, 1])), 0)


def test_cells_step_by_step_match_the_sequence_layer():
    for cell_cls, seq_cls in ((SimpleRNNCell, SimpleRNN), (GRUCell, GRU), (LSTMCell, LSTM)):
        seq = seq_cls(4, return_sequences=True)
        x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
        y = seq(x)
        cell = cell_cls(4)
        cell.build((None, 3))
        cell.built = True
        cell.set_weights(seq.get_weights())
        state = None
        for t in range(5):
            state = cell(x[:, t], state)
            h = state[0] if isinstance(state, list) else state
            assert_close(h, y[:, t], 1e-6, what=f"{cell_cls.__name__} step {t}")


def test_keras_gru_weight_order_and_classic_form():
    """A NumPy Keras GRU (gate order z, r, h; reset_after False and True) against attnx loaded with
    set_keras_weights."""
    rng = np.random.default_rng(0)
    C, H = 3, 4
    x = rng.standard_normal((2, 3, C))
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    for reset_after in (False, True):
        k = rng.standard_normal((C, 3 * H)) * 0.5
        rk = rng.standard_normal((H, 3 * H)) * 0.5
        b = rng.standard_normal((2, 3 * H) if reset_after else (3 * H,)) * 0.5
        b_in, b_rec = (b[0], b[1]) if reset_after else (b, np.zeros(3 * H))
        h = np.zeros((2, H))
        for t in range(3):
            xp = x[:, t] @ k + b_in
            if reset_after:
                hp = h @ rk + b_rec
                z, r = sig(xp[:, :H] + hp[:, :H]), sig(xp[:, H:2 * H] + hp[:, H:2 * H])
                hh = np.tanh(xp[:, 2 * H:] + r * hp[:, 2 * H:])
            else:
                z = sig(xp[:, :H] + h @ rk[:, :H])
                r = sig(xp[:, H:2 * H] + h @ rk[:, H:2 * H])
                hh = np.tanh(xp[:, 2 * H:] + (r * h) @ rk[:, 2 * H:])
            h = z * h + (1 - z) * hh
        layer = GRU(H, reset_after=reset_after, dtype="float64")
        layer.build((None, 3, C))
        layer.built = True
        layer.set_keras_weights([k, rk, b])
        assert_close(layer(x), h, 1e-12)
        for got, want in zip(layer.get_keras_weights(), [k, rk, b]):
            assert_close(got, want, 0)


def test_keras_layout_defaults_and_config_round_trip():
    layer = LSTM(5, return_sequences=True, num_layers=2, dropout=0.1)
    layer(np.zeros((1, 2, 3), np.float32))
    assert layer.params["kernel"].shape == (3, 20) and layer.params["recurrent_kernel"].shape == (5, 20)
    assert layer.params["kernel_1"].shape == (5, 20)
    assert_close(layer.params["bias"], np.r_[np.zeros(5), np.ones(5), np.zeros(10)], 0)  # unit_forget_bias
    u = layer.params["recurrent_kernel"]
    assert_close(u @ u.T, np.eye(5), 1e-5)  # orthogonal rows
    assert _built(GRU(4)).params["bias"].shape == (2, 12)
    assert _built(GRU(4, reset_after=False)).params["bias"].shape == (12,)
    clone = LSTM.from_config(layer.get_config())
    assert clone.get_config() == {**layer.get_config(), "name": clone.name}
    bi = Bidirectional(GRU(3), merge_mode="sum")
    bi2 = Bidirectional.from_config(bi.get_config())
    assert bi2.merge_mode == "sum" and isinstance(bi2.backward_layer, GRU)
    bi(np.zeros((1, 2, 3), np.float32))
    assert list(bi.params)[:3] == ["forward_kernel", "forward_recurrent_kernel", "forward_bias"]
    assert len(bi.get_weights()) == 6


def _torch_packed_run(torch, module, kind, x, lengths, upstream=None):
    """torch's padded output and final states (h, and c for LSTM) for rows of `lengths`, and the
    input tensor; with upstream, their gradients are backpropagated into module and the input."""
    xt = torch.tensor(x, requires_grad=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(xt, torch.tensor(lengths), batch_first=True,
                                                     enforce_sorted=False)
    po, finals = module(packed)
    y_t, _ = torch.nn.utils.rnn.pad_packed_sequence(po, batch_first=True, total_length=x.shape[1])
    outputs = [y_t] + [f[0] for f in (finals if kind == "LSTM" else [finals])]
    if upstream is not None:
        torch.autograd.backward(outputs, [torch.from_numpy(u) for u in upstream])
    return outputs, xt


@pytest.mark.parametrize("H", [1, 2, 4, 17, 20, 36, 100])
@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_units_past_the_last_whole_vector_match_torch(torch, kind, H, level):
    """The time loops' edges on each SIMD level: LSTM's last units share one vector of the step's
    product when four of them fit (H mod 16 <= 4 on AVX-512, H mod 8 <= 2 on AVX2, H mod 4 == 1 on
    baseline), and the backward's one product gives dh and dx side by side (W^T from H rounded up
    to whole vectors). Outputs, final states and every gradient against torch, with padded rows;
    from H = 36 on the batch rows split across two threads."""
    rng = np.random.default_rng(H)
    B, T, C = 9, 5, 7
    module = getattr(torch.nn, kind)(C, H, batch_first=True)
    layer = from_torch(module)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    lengths = np.array([5, 3, 1, 5, 4, 2, 5, 5, 3])
    out = layer(x, training=True, lengths=lengths)
    assert_close(layer(x, lengths=lengths)[0], out[0], 1e-6, what="inference = training output")
    upstream = [rng.standard_normal(np.shape(o)).astype(np.float32) for o in out]
    want, xt = _torch_packed_run(torch, module, kind, x, lengths, upstream)
    for got, w, what in zip(out, want, ["output", "h", "c"]):
        assert_close(got, w.detach().numpy(), 1e-5, what=what)
    layer.zero_grad()
    dx = layer.backward(upstream)
    assert_close(dx, xt.grad.numpy(), 1e-5, what="dx")
    for name, g in torch_grads(module, layer).items():
        assert_close(layer.grads[name], g, 1e-5, what=f"d {name}")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_weight_gradients_over_many_rows_match_torch(torch, kind, threads):
    """Weight gradients summed over more rows than one block of the backward's product: LSTM and
    SimpleRNN take [dW; dU] from [x | h]^T . dgates in blocks of 256 rows (B * T = 600 rows here:
    one thread's 600 or two threads' 300, each a whole block and a part), GRU from its two GEMMs."""
    rng = np.random.default_rng(len(kind) + threads)
    B, T, C, H = 12, 50, 3, 40
    module = getattr(torch.nn, kind)(C, H, batch_first=True)
    layer = from_torch(module)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    lengths = rng.integers(1, T + 1, B)
    budget = attnx.backend.get_num_threads()
    try:
        attnx.set_num_threads(threads)
        out = layer(x, training=True, lengths=lengths)  # output and final states
        upstream = [rng.standard_normal(np.shape(o)).astype(np.float32) for o in out]
        layer.zero_grad()
        dx = layer.backward(upstream)
    finally:
        attnx.set_num_threads(budget)
    want, xt = _torch_packed_run(torch, module, kind, x, lengths, upstream)
    for got, w, what in zip(out, want, ["output", "h", "c"]):
        assert_close(got, w.detach().numpy(), 1e-5, what=what)
    assert_close(dx, xt.grad.numpy(), 1e-4, what="dx")
    for name, g in torch_grads(module, layer).items():
        assert_close(layer.grads[name], g, 1e-4 * max(1.0, np.abs(g).max()), what=f"d {name}")


@pytest.mark.parametrize("cls,kw", [(SimpleRNN, {}), (GRU, {"reset_after": False}), (GRU, {}), (LSTM, {})])
def test_gradcheck_recurrent_dropout_over_many_rows(cls, kw):
    """dU from the dropped-out state over 2 * 150 = 300 rows (a whole block of the product and a part)."""
    layer = _f64(cls, recurrent_dropout=0.4, return_sequences=True, **kw)
    layer.seed_generator.next_key = lambda: 3  # the same masks on every forward pass
    gradcheck(layer, _x(B=2, T=150, C=2), call_kwargs={"lengths": np.array([97, 150])})


def test_edge_sizes_batch_one_and_length_one(torch):
    module = torch.nn.GRU(3, 4, batch_first=True, bidirectional=True)
    layer = from_torch(module)
    for shape in [(1, 6, 3), (5, 1, 3), (1, 1, 3)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        out = layer(x, training=True)
        assert_close(out[0], module(torch.from_numpy(x))[0].detach().numpy(), 1e-5)
        dx = layer.backward([np.ones_like(o) for o in out])
        assert dx.shape == shape


@pytest.mark.parametrize("make", [lambda: SimpleRNN(40, return_sequences=True),
                                  lambda: GRU(40, return_sequences=True),
                                  lambda: GRU(40, return_sequences=True, reset_after=False),
                                  lambda: LSTM(40, return_sequences=True)])
def test_split_batch_threads_match_single_thread(make):
    """The time loops with the batch rows split across two threads (B * T * G * H multiply-adds
    of h . U >= 2^17: here 16 * 8 * 40 * 40 and more) give one thread's outputs, input gradient and
    weight and bias gradients (each thread sums its own, added under a lock)."""
    layer = make()
    x = np.random.default_rng(0).standard_normal((16, 8, 3)).astype(np.float32)
    lengths = np.arange(16) % 8 + 1
    results, budget = [], attnx.backend.get_num_threads()
    try:
        for threads in (2, 1):
            attnx.set_num_threads(threads)
            y = layer(x, training=True, lengths=lengths)
            layer.zero_grad()
            dx = layer.backward(np.cos(np.arange(y.size, dtype=np.float32)).reshape(y.shape))
            results.append((y, dx, {k: g.copy() for k, g in layer.grads.items()}))
    finally:
        attnx.set_num_threads(budget)
    (y2, dx2, g2), (y1, dx1, g1) = results
    assert_close(y1, y2, 1e-6, what="output")
    assert_close(dx1, dx2, 1e-6, what="dx")
    assert g1.keys() == g2.keys() and len(g1) >= 3
    for k in g1:
        assert_close(g1[k], g2[k], 1e-5 * max(1.0, np.abs(g1[k]).max()), what=f"d {k}")


# ------------------------------------------------------------------------ per-call state
SB, ST, SC = 3, 4, 2  # batch, steps, features of the inputs below
SHARED_LENGTHS = {"lengths": np.array([4, 1, 3])}


def _sequence(states=0, state_shape=(SB, 3)):
    """inputs(seed): x (SB, ST, SC), followed by `states` initial states when there are any."""
    def inputs(seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((SB, ST, SC))
        return [x] + [rng.standard_normal(state_shape) for _ in range(states)] if states else x
    return inputs


def _step(states):
    """inputs(seed) of a cell: x (SB, SC), followed by `states` states when there are any."""
    def inputs(seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((SB, SC))
        return [x] + [rng.standard_normal((SB, 3)) for _ in range(states)] if states else x
    return inputs


def _f64_bi(cls, merge_mode="concat", **kw):
    return lambda: Bidirectional(cls(3, dtype="float64", **kw), merge_mode=merge_mode)


# name: (a fresh layer, inputs(seed), call kwargs)
SHARED_CASES = {
    "SimpleRNN": (lambda: _f64(SimpleRNN, return_sequences=True), _sequence(), SHARED_LENGTHS),
    "GRU reset_after": (lambda: _f64(GRU), _sequence(), SHARED_LENGTHS),
    "GRU classic": (lambda: _f64(GRU, reset_after=False, return_sequences=True), _sequence(), SHARED_LENGTHS),
    "LSTM": (lambda: _f64(LSTM), _sequence(), SHARED_LENGTHS),
    "LSTM stacked": (lambda: _f64(LSTM, num_layers=2, return_sequences=True), _sequence(), SHARED_LENGTHS),
    "LSTM return_state, initial states": (lambda: _f64(LSTM, return_state=True, go_backwards=True),
                                          _sequence(states=2), SHARED_LENGTHS),
    "GRU stacked, sequences and states": (lambda: _f64(GRU, num_layers=2, return_sequences=True,
                                                       return_state=True),
                                          _sequence(states=1, state_shape=(2, SB, 3)), {}),
    "LSTM stacked dropout": (lambda: _f64(LSTM, num_layers=2, dropout=0.3, recurrent_dropout=0.3,
                                          stack_dropout=0.2, return_sequences=True), _sequence(), SHARED_LENGTHS),
    **{f"Bidirectional {mode}": (_f64_bi(LSTM, mode, return_sequences=True), _sequence(), SHARED_LENGTHS)
       for mode in ("concat", "sum", "mul", "ave", None)},
    "Bidirectional GRU stacked, states, dropout": (
        _f64_bi(GRU, "concat", num_layers=2, return_state=True, dropout=0.2, recurrent_dropout=0.2),
        _sequence(states=2, state_shape=(2, SB, 3)), SHARED_LENGTHS),
    "SimpleRNNCell": (lambda: SimpleRNNCell(3, dtype="float64"), _step(1), {}),
    "GRUCell reset_after": (lambda: GRUCell(3, dtype="float64"), _step(1), {}),
    "GRUCell classic": (lambda: GRUCell(3, reset_after=False, dtype="float64"), _step(0), {}),
    "LSTMCell": (lambda: LSTMCell(3, dtype="float64"), _step(2), {}),
}


def _items(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _share_noise(layers, seed):
    """Makes the dropout masks of `layers` come from one generator, so that calls made in the
    same order draw the same masks."""
    shared = attnx.random.SeedGenerator(seed)
    for layer in layers:
        for sub in (layer.forward_layer, layer.backward_layer) if isinstance(layer, Bidirectional) else (layer,):
            sub.seed_generator = shared


@pytest.mark.parametrize("case", list(SHARED_CASES))
def test_layer_applied_twice_gets_each_calls_gradients(case):
    """One layer applied to two inputs, then backprop of both caches in reverse order, gives each
    call's own input gradients and the sum of the parameter gradients of two unshared twins (the
    same shapes on purpose: reused workspaces let the second call overwrite the first's state)."""
    make, inputs, kwargs = SHARED_CASES[case]
    xs = [inputs(1), inputs(2)]
    shared, twins = make(), [make(), make()]
    for layer in [shared] + twins:
        layer.apply(xs[0], **kwargs)  # builds
    for twin in twins:
        twin.set_weights(shared.get_weights())
    _share_noise([shared], seed=7)
    _share_noise(twins, seed=7)

    calls = [shared.apply(x, training=True, **kwargs) for x in xs]
    twin_calls = [twin.apply(x, training=True, **kwargs) for twin, x in zip(twins, xs)]
    rng = np.random.default_rng(0)
    upstream = [[rng.standard_normal(np.shape(o)) for o in _items(out)] for out, _ in calls]
    upstream = [u if isinstance(out, list) else u[0] for u, (out, _) in zip(upstream, calls)]
    dxs = [None, None]
    for i in (1, 0):
        dxs[i] = shared.backprop(calls[i][1], upstream[i])
    for i, (twin, (twin_out, twin_cache)) in enumerate(zip(twins, twin_calls)):
        for got, want in zip(_items(calls[i][0]), _items(twin_out)):
            assert_close(got, want, 1e-12, what=f"call {i} output")
        twin_dx = twin.backprop(twin_cache, upstream[i])
        assert len(_items(dxs[i])) == len(_items(twin_dx))
        for k, (got, want) in enumerate(zip(_items(dxs[i]), _items(twin_dx))):
            assert_close(got, want, 1e-10, what=f"call {i} input gradient {k}")
    for name, g in shared.grads.items():
        assert_close(g, twins[0].grads[name] + twins[1].grads[name], 1e-10, what=f"d {name}")


@pytest.mark.parametrize("case", ["LSTM stacked dropout", "LSTM return_state, initial states",
                                  "Bidirectional GRU stacked, states, dropout", "LSTMCell"])
def test_input_gradient_not_needed_skips_dx_only(case):
    """With need_dx=False the input's gradient is None; the parameters' (and the
    initial states') are unchanged."""
    make, inputs, kwargs = SHARED_CASES[case]
    x = inputs(1)
    layers = [make(), make()]
    for layer in layers:
        layer.apply(x, **kwargs)
    layers[1].set_weights(layers[0].get_weights())
    _share_noise(layers[:1], seed=7)
    _share_noise(layers[1:], seed=7)
    calls = [layer.apply(x, training=True, **kwargs) for layer in layers]
    dy = [np.ones_like(o) for o in _items(calls[0][0])]
    dy = dy if isinstance(calls[0][0], list) else dy[0]
    full, skipped = [_items(layer.backprop(cache, dy, need_dx=needed)) for layer, (_, cache), needed in
                     zip(layers, calls, (True, False))]
    assert full[0] is not None and skipped[0] is None
    for got, want in zip(skipped[1:], full[1:]):
        assert_close(got, want, 0, what="state gradient")
    for name, g in layers[0].grads.items():
        assert_close(layers[1].grads[name], g, 0, what=f"d {name}")


RNN_LAYERS = {
    "SimpleRNN": lambda **kw: _f64(SimpleRNN, **kw),
    "GRU": lambda **kw: _f64(GRU, **kw),
    "GRU classic": lambda **kw: _f64(GRU, reset_after=False, **kw),
    "LSTM stacked": lambda **kw: _f64(LSTM, num_layers=2, **kw),
    "Bidirectional LSTM": lambda **kw: Bidirectional(_f64(LSTM, **kw)),
}


@pytest.mark.parametrize("name", list(RNN_LAYERS))
def test_zero_length_row_keeps_initial_state_and_outputs_zeros(name):
    """lengths 0: every step is padding, so the row outputs zeros, its final state is its initial
    state and the state's gradient passes straight back; no NaN anywhere."""
    layer = RNN_LAYERS[name](return_sequences=True, return_state=True)
    x = _x(B=2, T=4, C=3)
    layer.apply(x)
    n_states = len(layer(x)) - 1
    state_shape = np.shape(layer(x)[1])
    rng = np.random.default_rng(1)
    states = [rng.standard_normal(state_shape) for _ in range(n_states)]
    lengths = np.array([0, 3])
    out = layer([x] + states, training=True, lengths=lengths)
    assert all(np.all(np.isfinite(o)) for o in out)
    assert not out[0][0].any()
    for final, initial in zip(out[1:], states):
        assert_close(final[..., 0, :], initial[..., 0, :], 0, what="final state of the empty row")
    upstream = [rng.standard_normal(np.shape(o)) for o in out]
    grads = layer.backward(upstream)
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert not grads[0][0].any()
    for d_initial, d_final in zip(grads[1:], upstream[1:]):
        assert_close(d_initial[..., 0, :], d_final[..., 0, :], 0, what="state gradient of the empty row")
    gradcheck(layer, [x] + states, call_kwargs={"lengths": lengths})


@pytest.mark.parametrize("name", list(RNN_LAYERS))
def test_all_rows_empty(name):
    layer = RNN_LAYERS[name](return_sequences=True)
    y = layer(_x(), training=True, lengths=np.array([0, 0]))
    assert y.shape[:2] == (2, 4) and not y.any()
    dx = layer.backward(np.ones_like(y))
    assert dx.shape == (2, 4, 3) and not dx.any()
    assert all(np.all(np.isfinite(g)) for g in layer.grads.values())


@pytest.mark.parametrize("name", list(RNN_LAYERS))
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_integer_mask_equals_bool_mask(name, dtype):
    layer = RNN_LAYERS[name](return_sequences=True)
    x = _x()
    upstream = np.random.default_rng(3).standard_normal(np.shape(layer(x)))
    results = []
    for mask in (PRE_PAD, PRE_PAD.astype(dtype)):
        y = layer(x, training=True, mask=mask)
        layer.zero_grad()
        dx = layer.backward(upstream)
        results.append([y, dx] + [g.copy() for g in layer.grads.values()])
    for got, want in zip(*results):
        assert_close(got, want, 0)


# ------------------------------------------------------------------------ bad input
def _built_lstm():
    layer = LSTM(4, name="enc")
    layer(np.zeros((2, 3, 5), np.float32))
    return layer


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda l: l(np.zeros((2, 5), np.float32)), ValueError, r"'enc'.*`inputs` expected rank 3"),
    (lambda l: l(np.zeros((2, 3, 6), np.float32)), ValueError, r"'enc'.*last axis of size 5.*\(2, 3, 6\)"),
    (lambda l: l(np.zeros((2, 3, 5)), mask=np.ones((2, 4), bool)), ValueError,
     r"'enc'.*`mask`.*expected a mask of shape \(2, 3\)"),
    (lambda l: l(np.zeros((2, 3, 5)), mask=np.ones((2, 3))), TypeError, r"'enc'.*`mask`.*bool mask"),
    (lambda l: l(np.zeros((2, 3, 5)), mask=np.array([[0, 1, 2], [1, 1, 1]])), ValueError, r"'enc'.*only 0 and 1"),
    (lambda l: l(np.zeros((2, 3, 5)), lengths=np.array([-1, 3])), ValueError, r"'enc'.*`lengths`.*in \[0, 3\]"),
    (lambda l: l(np.zeros((2, 3, 5)), lengths=np.array([4, 3])), ValueError, r"'enc'.*`lengths`.*in \[0, 3\]"),
    (lambda l: l(np.zeros((2, 3, 5)), mask=np.ones((2, 3), bool), lengths=np.array([3, 3])), ValueError,
     r"'enc'.*not both"),
    (lambda l: l(np.zeros((2, 3, 5)), lengths=np.array([1.5, 3])), TypeError, r"'enc'.*`lengths`.*integer lengths"),
    (lambda l: l(np.zeros((2, 3, 5)), lengths=np.array([1, 2, 3])), ValueError, r"`lengths`.*expected lengths of shape \(2,\)"),
    (lambda l: l(np.zeros((2, 3, 5)), initial_state=[np.zeros((2, 3)), np.zeros((2, 4))]), ValueError,
     r"'enc'.*`initial_state\[0\]` expected shape \(2, 4\), got \(2, 3\)"),
    (lambda l: l(np.zeros((2, 3, 5)), initial_state=[np.zeros((2, 4))]), ValueError, r"expected 2 initial state"),
    (lambda l: l(np.zeros((2, 0, 5), np.float32)), ValueError, r"empty"),
    (lambda l: l.backward(np.zeros((2, 4))), RuntimeError, r"'enc'.*training=True"),
])
def test_bad_input(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(_built_lstm())


def test_bad_config_and_backward_shapes():
    with pytest.raises(ValueError, match="activation"):
        LSTM(3, activation="gelu")
    with pytest.raises(ValueError, match="dropout"):
        GRU(3, dropout=1.0)
    with pytest.raises(ValueError, match="merge_mode"):
        Bidirectional(GRU(3), merge_mode="max")
    with pytest.raises(TypeError, match="Bidirectional"):
        Bidirectional(Dense(3))
    layer = GRU(3, return_sequences=True, name="g")
    layer(np.zeros((2, 4, 2), np.float32), training=True)
    with pytest.raises(ValueError, match=r"'g'.*`dy` expected shape \(2, 4, 3\)"):
        layer.backward(np.zeros((2, 3)))
    cell = LSTMCell(3, name="cell")
    with pytest.raises(ValueError, match=r"'cell'.*`states\[1\]` expected shape \(2, 3\)"):
        cell(np.zeros((2, 2)), [np.zeros((2, 3)), np.zeros((3, 3))])
    with pytest.raises(ValueError, match="reset_after=False"):
        to_torch(_built(GRU(3, reset_after=False)))


def _built(layer):
    layer(np.zeros((1, 2, 2), np.float32))
    return layer


def test_kernel_binding_rejects_bad_buffers():
    from attnx import _core
    x = np.zeros((2, 3, 4), np.float32)
    W, U = np.zeros((4, 8), np.float32), np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="kernel: expected shape"):
        _core.rnn_forward("lstm", x, np.zeros((5, 8), np.float32), U, None, None, None, None, None, None)
    with pytest.raises(TypeError, match="dtype"):
        _core.rnn_forward("lstm", x, W.astype(np.float64), U, None, None, None, None, None, None)
    with pytest.raises(TypeError, match="mask"):
        _core.rnn_forward("lstm", x, W, U, None, None, None, None, np.ones((2, 3), np.float32), None)
    with pytest.raises(ValueError, match="mask: an integer mask holds only 0 and 1"):
        _core.rnn_forward("lstm", x, W, U, None, None, None, None, np.full((2, 3), 2, np.int32), None)
    with pytest.raises(ValueError, match="unknown cell"):
        _core.rnn_forward("lstmx", x, W, U, None, None, None, None, None, None)


# ------------------------------------------------------------------------ end to end
def test_sequential_masked_bidirectional_encoder_learns():
    """Embedding(mask_zero) -> Bidirectional(LSTM) -> Dense in a Sequential model learns whether
    token 1 occurs in a post-padded sequence; pre-padding the same tokens predicts the same."""
    from attnx.models import Sequential
    rng = np.random.default_rng(0)
    n, T = 512, 8
    lengths = rng.integers(2, T + 1, size=n)
    ids = rng.integers(2, 20, size=(n, T))
    y = rng.integers(0, 2, size=n)
    pos = (rng.random(n) * lengths).astype(int)
    ids[y == 1, pos[y == 1]] = 1
    ids[np.arange(T)[None, :] >= lengths[:, None]] = 0
    model = Sequential([Embedding(20, 8, mask_zero=True), Bidirectional(LSTM(8)), Dense(1, activation="sigmoid")])
    model.compile(optimizer=attnx.optimizers.Adam(0.02), loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(ids, y.astype(np.float32), epochs=12, batch_size=32, verbose=0)
    accuracy = np.mean((model.predict(ids, verbose=0)[:, 0] > 0.5) == y)
    assert accuracy > 0.95
    shift = (np.arange(T)[None, :] - (T - lengths)[:, None]) % T
    pre_padded = np.take_along_axis(ids, shift, axis=1)
    assert (pre_padded[:, -1] != 0).all()
    assert_close(model.predict(pre_padded, verbose=0), model.predict(ids, verbose=0), 1e-5)


@pytest.mark.parametrize("layer_class", [SimpleRNN, GRU, LSTM])
@pytest.mark.parametrize("go_backwards", [False, True])
def test_zero_output_for_mask_false_carries_the_last_real_output(layer_class, go_backwards):
    x = np.random.default_rng(0).normal(size=(3, 6, 4))
    mask = np.array([[1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 0, 1], [0, 0, 1, 1, 1, 1]], bool)
    layer = layer_class(5, return_sequences=True, zero_output_for_mask=False, go_backwards=go_backwards,
                        dtype="float64")
    carried = layer(x, mask=mask)
    zeroed = layer_class.from_config({**layer.get_config(), "zero_output_for_mask": True})
    zeroed(x, mask=mask)  # builds it
    zeroed.set_weights(layer.get_weights())
    expected = zeroed(x, mask=mask)
    processing_mask = mask[:, ::-1] if go_backwards else mask
    for b in range(3):
        last = None
        for t in range(6):
            if processing_mask[b, t]:
                last = expected[b, t]
            np.testing.assert_allclose(carried[b, t], expected[b, t] if last is None else last)
    assert max(gradcheck(layer, x, call_kwargs={"mask": mask}).values()) < 1e-7


@pytest.mark.parametrize("kind", ["SimpleRNN", "GRU", "LSTM"])
def test_reset_state_checks_its_states_before_keeping_them(kind):
    from attnx import layers
    """Bad states are a TypeError / ValueError at reset_state, never an IndexError at the next call."""
    layer = getattr(layers, kind)(3, stateful=True)
    x = np.ones((2, 4, 5), np.float32)
    layer(x)
    n = 2 if kind == "LSTM" else 1
    good = [np.zeros((2, 3), np.float32)] * n
    for bad, error in ((0.0, ValueError), (np.zeros(3), ValueError),
                       ([None] * n, TypeError), ([np.zeros((2, 4))] * n, ValueError),
                       ([np.zeros((2, 3)), np.zeros((3, 3))] if n == 2 else [np.zeros((0, 3))], ValueError),
                       (["ab"] * n, TypeError), (good + good, ValueError)):
        with pytest.raises(error, match="reset_state"):
            layer.reset_state(bad)
    layer.reset_state(good)
    assert layer(x).shape == (2, 3)
    stacked = getattr(layers, kind)(3, stateful=True, num_layers=2)
    stacked(x)
    with pytest.raises(ValueError, match=r"\(2, batch, 3\)"):
        stacked.reset_state([np.zeros((2, 3))] * n)
    stacked.reset_state([np.zeros((2, 2, 3))] * n)
    bi = layers.Bidirectional(getattr(layers, kind)(3, stateful=True))
    bi(x)
    for bad in (0.0, good, [None] * (2 * n)):
        with pytest.raises((TypeError, ValueError), match="reset_state"):
            bi.reset_state(bad)
    bi.reset_state(good + good)


def test_orthogonal_initializer_is_the_q_of_qr_with_a_positive_diagonal():
    """Orthogonal: Q of QR of a normal matrix, columns signed so R's diagonal is positive (uniform over the
    orthogonal matrices), as NumPy's QR gives it; LAPACK on one thread (kernels.orthogonal_factor)."""
    from attnx import initializers, kernels
    rng = np.random.default_rng(5)
    for rows, cols in ((400, 100), (7, 7), (3, 1), (1, 1)):
        a = rng.standard_normal((rows, cols))
        q = kernels.orthogonal_factor(a=a)
        want, r = np.linalg.qr(a)
        want *= np.sign(np.diag(r))
        assert_close(q, want, 1e-12)
        assert_close(q.T @ q, np.eye(cols), 1e-12)
    assert kernels.orthogonal_factor(a=np.zeros((3, 0))).shape == (3, 0)
    u = initializers.Orthogonal(gain=2.0)((5, 20))  # wide: orthogonal rows
    assert u.dtype == np.float32 and u.shape == (5, 20)
    assert_close(u @ u.T, 4 * np.eye(5), 1e-5)
    with pytest.raises(ValueError, match=r"orthogonal_factor: a needs at least as many rows as columns, got \(2, 3\)"):
        kernels.orthogonal_factor(a=np.ones((2, 3)))
    with pytest.raises(TypeError, match="orthogonal_factor: a"):
        kernels.orthogonal_factor(a=np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="orthogonal_factor: a"):
        kernels.orthogonal_factor(a=np.ones(3))
