"""The one mask rule of the raw `_core` bindings (checks.hpp parse_mask): every entry point that
takes a mask accepts the same masks, rejects the same bad ones with the same error pattern
("<function>: <argument>: ..."), and gives a fully masked row zeros, never NaN."""
import os
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnx import _core

B, L, TQ = 2, 5, 3  # batch rows, masked length (source or time steps), queries
f32 = np.float32
rng = np.random.default_rng(0)


def _rand(*shape):
    return rng.normal(size=shape).astype(f32)


def _decoder_params(E=3, H=4, K=4, U=3, V=7):
    G = 3 * H  # GRU
    return {"embeddings": _rand(V, E), "kernel": _rand(E + K, G), "recurrent_kernel": _rand(H, G),
            "bias": _rand(2, G), "query_kernel": _rand(H, U), "query_bias": _rand(U), "key_kernel": _rand(K, U),
            "score_vector": _rand(U), "output_kernel": _rand(H, V), "output_bias": _rand(V)}


DEC_PARAMS = _decoder_params()
ENC = _rand(B, L, 4)
X_RNN = _rand(B, L, 3)
RNN_W, RNN_U = _rand(3, 12), _rand(4, 12)
Q, KEY, VALUE, SCORES = _rand(B, TQ, 4), _rand(B, L, 4), _rand(B, L, 2), _rand(B, 1, TQ, L)
POOL_W, POOL_B = _rand(3, 1), _rand(1, 1)


def _rnn_backward(mask):
    _, _, _, cache = _core.rnn_forward(cell="gru", x=X_RNN, kernel=RNN_W, recurrent_kernel=RNN_U, bias=None,
                                       recurrent_bias=None, h0=None, c0=None, mask=None, recurrent_mask=None)
    return _core.rnn_backward(cell="gru", x=X_RNN, kernel=RNN_W, recurrent_kernel=RNN_U, cache=cache, mask=mask,
                              recurrent_mask=None, dy=None, dh=np.ones((B, 4), f32), dc=None,
                              dkernel=np.zeros_like(RNN_W), drecurrent_kernel=np.zeros_like(RNN_U), dbias=None,
                              drecurrent_bias=None)[1]


# name -> (argument name, takes the per-query form (B, TQ, L), call(mask) -> output whose rows are batch rows
# (the first returned array))
ENTRY_POINTS = {
    "sdpa_forward": ("mask", True, lambda m: _core.sdpa_forward(
        query=Q, key=KEY, value=VALUE, mask=m)[0]),
    "softmax_context_forward": ("mask", True, lambda m: _core.softmax_context_forward(
        scores=SCORES, value=VALUE, mask=m)[0]),
    "masked_softmax_forward": ("mask", True, lambda m: _core.masked_softmax_forward(
        scores=SCORES, mask=m)),
    "local_window_forward": ("source_mask", False, lambda m: _core.local_window_forward(
        positions=np.full((B, TQ), 2.0, f32), source_len=L, window=2, source_mask=m)[0]),
    "attention_pooling_forward": ("mask", False, lambda m: _core.attention_pooling_forward(
        x=X_RNN, kernel=POOL_W, bias=POOL_B, mask=m)[0]),
    "rnn_forward": ("mask", False, lambda m: _core.rnn_forward(
        cell="gru", x=X_RNN, kernel=RNN_W, recurrent_kernel=RNN_U, bias=None, recurrent_bias=None, h0=None,
        c0=None, mask=m, recurrent_mask=None)[1]),
    "rnn_backward": ("mask", False, _rnn_backward),
    "decoder_forward": ("source_mask", False, lambda m: _core.decoder_forward(
        kind="bahdanau", score="additive", cell="gru", ids=np.ones((B, 2), np.int64), enc=ENC, source_mask=m,
        h0=np.zeros((B, 4), f32), params=DEC_PARAMS)[4]),
    "decoder_forward:target_mask": ("target_mask", False, lambda m: _core.decoder_forward(
        kind="bahdanau", score="additive", cell="gru", ids=np.ones((B, L), np.int64), enc=ENC, target_mask=m,
        h0=np.zeros((B, 4), f32), params=DEC_PARAMS)[0]),
    "search_attention_decoder": ("source_mask", False, lambda m: _core.search_attention_decoder(
        kind="bahdanau", score="additive", cell="gru", enc=ENC, source_mask=m, h0=np.zeros((B, 4), f32),
        params=DEC_PARAMS, start_id=1, end_id=2, width=1, length_penalty=0.0, max_length=3,
        return_attention=True)[4]),
}

GOOD = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]], bool)
GOOD_MASKS = {
    "bool": GOOD,
    "int64": GOOD.astype(np.int64),
    "int8": GOOD.astype(np.int8),
    "uint8": GOOD.astype(np.uint8),
    "uint32": GOOD.astype(np.uint32),
    "strided": np.repeat(GOOD, 2, axis=1)[:, ::2],
    "fortran": np.asfortranarray(GOOD),
    "readonly": np.array(GOOD),
    "list": GOOD.tolist(),
}
GOOD_MASKS["readonly"].flags.writeable = False

# bad mask -> (exception, message pattern after "<function>: <argument>: ")
BAD_MASKS = {
    "float32": (GOOD.astype(f32), TypeError, r"expected a bool or 0/1 integer mask, got dtype float32"),
    "complex": (GOOD.astype(np.complex64), TypeError, r"expected a bool or 0/1 integer mask, got dtype complex64"),
    "str": (np.array([["a"] * L] * B), TypeError, r"expected a bool or 0/1 integer mask, got dtype <U1"),
    "object": (GOOD.astype(object), TypeError, r"expected a bool or 0/1 integer mask, got dtype object"),
    "two": (GOOD.astype(np.int32) * 2, ValueError, r"an integer mask holds only 0 and 1, got 2"),
    "minus_one": (-GOOD.astype(np.int64), ValueError, r"an integer mask holds only 0 and 1, got -1"),
    "uint8_255": (GOOD.astype(np.uint8) * 255, ValueError, r"an integer mask holds only 0 and 1, got 255"),
    "long": (np.ones((B, L + 1), bool), ValueError, r"expected shape \(2, 5\).*got \(2, 6\)"),
    "batch": (np.ones((B + 1, L), bool), ValueError, r"expected shape \(2, 5\).*got \(3, 5\)"),
    "rank1": (np.ones(L, bool), ValueError, r"expected shape \(2, 5\).*got \(5,\)"),
    "rank4": (np.ones((B, 1, TQ, L), bool), ValueError, r"expected shape \(2, 5\).*got \(2, 1, 3, 5\)"),
}


def _prefix(name):
    arg = ENTRY_POINTS[name][0]
    return re.escape(f"{name.split(':')[0]}: {arg}: ")


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_good_masks_agree(name):
    """bool, any 0/1 integer dtype, any layout, read-only or a list: one result."""
    call = ENTRY_POINTS[name][2]
    want = call(GOOD)
    for kind, mask in GOOD_MASKS.items():
        np.testing.assert_array_equal(call(mask), want, err_msg=f"{name}: {kind} mask")


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_shared_mask_is_the_mask_of_every_row(name):
    call = ENTRY_POINTS[name][2]
    shared = GOOD[:1]
    np.testing.assert_array_equal(call(shared), call(np.repeat(shared, B, axis=0)))


@pytest.mark.parametrize("name", ENTRY_POINTS)
@pytest.mark.parametrize("bad", BAD_MASKS)
def test_bad_masks_raise_the_same_error(name, bad):
    mask, exc, pattern = BAD_MASKS[bad]
    with pytest.raises(exc, match="^" + _prefix(name) + pattern):
        ENTRY_POINTS[name][2](mask)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_per_query_masks_only_where_supported(name):
    _, per_query, call = ENTRY_POINTS[name]
    full = np.broadcast_to(GOOD[:, None, :], (B, TQ, L)).copy()
    if per_query:
        np.testing.assert_array_equal(call(full), call(GOOD))
        with pytest.raises(ValueError, match="^" + _prefix(name) + r"expected shape \(2, 5\) or \(2, 3, 5\)"):
            call(np.ones((B, TQ + 1, L), bool))
    else:
        with pytest.raises(ValueError, match="^" + _prefix(name) + r"expected shape \(2, 5\) \(a leading 1"):
            call(full)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_fully_masked_row_gives_zeros(name):
    """A row with nothing real: allowed everywhere; zero weights, context, pooled output and state
    update (the RNN's state stays h0 = 0, its gradient passes through), never NaN."""
    call = ENTRY_POINTS[name][2]
    mask = GOOD.copy()
    mask[1] = False
    out = np.asarray(call(mask))
    assert np.isfinite(out).all()
    if name == "decoder_forward:target_mask":
        return  # padded target steps still produce logits; only the loss ignores them
    if name == "rnn_backward":
        np.testing.assert_array_equal(out[1], np.ones(4, f32))  # dh0 = dh: no step touched the state
        return
    if name == "local_window_forward":
        assert not out[1].any()
        return
    assert not out[1].any(), f"{name}: a fully masked row is not zero"


INT_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


@pytest.mark.parametrize("name", ENTRY_POINTS)
@settings(max_examples=int(os.environ.get("ATTNX_FUZZ_EXAMPLES", "25")), derandomize=True, deadline=None,
          database=None)
@given(data=st.data())
def test_fuzzed_masks(name, data):
    """Random masks: accepted exactly when bool or 0/1 integer of an accepted shape, and then equal
    to the same mask as bool; refused with the "<function>: <argument>: " prefix otherwise."""
    arg, per_query, call = ENTRY_POINTS[name]
    shapes = [(B, L), (1, L), (B, L + 1), (B + 1, L), (L,), (B, TQ, L), (1, TQ, L), (B, TQ + 1, L)]
    shape = data.draw(st.sampled_from(shapes))
    dtype = data.draw(st.sampled_from([bool, np.float32] + INT_DTYPES))
    values = data.draw(st.sampled_from([(0, 1), (0, 2), (0, 1, 255)]))
    r = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    mask = r.choice(values, size=shape).astype(dtype)
    valid_shape = shape in [(B, L), (1, L)] or (per_query and shape in [(B, TQ, L), (1, TQ, L)])
    valid = valid_shape and dtype is not np.float32 and (dtype is bool or (mask.min() >= 0 and mask.max() <= 1))
    if not valid:
        with pytest.raises((TypeError, ValueError), match="^" + _prefix(name)):
            call(mask)
        return
    np.testing.assert_array_equal(call(mask), call(mask.astype(bool)))
