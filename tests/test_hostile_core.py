"""Issue 14's hostile calls on the raw `_core` bindings: sizes past int (faked with zero-size and
zero-stride arrays, which cost no memory), crafted seq2seq caches and parameter dicts, ids of the
wrong dtype, range or alignment, first_step overflow, thread counts above the machine's, and
per-thread inference scratch. Each must raise a clear Python exception (or work), never crash,
hang, allocate what the input does not justify, or return a wrong answer."""
import os
import resource
import threading

import numpy as np
import pytest

import attnx
from attnx import _core, layers

f32 = np.float32
BIG = 2 ** 31 + 16   # one past int: the cast wrapped to a negative size (segfault)
HUGE = 2 ** 32 + 16  # wrapped to 16: only 16 rows were computed, the rest silently 0
LIMIT = r"exceeds the kernels' limit of 2\*\*31 - 1"


# ------------------------------------------------------------------------- sizes past int
@pytest.mark.parametrize("rows", [BIG, HUGE])
def test_dense_rows_past_int(rows):
    x = np.empty((rows, 0), f32)  # zero columns: no memory, yet rows results are asked for
    with pytest.raises(ValueError, match=r"dense_forward: x: shape \(\d+, 0\) " + LIMIT):
        _core.dense_forward(x=x, kernel=np.empty((0, 1), f32), bias=np.zeros(1, f32))


def test_dense_layer_rows_past_int():
    layer = layers.Dense(1)
    with pytest.raises(ValueError, match=LIMIT):
        layer(np.empty((BIG, 0), f32))


def test_attention_pooling_batch_past_int_does_not_hang():
    x = np.empty((2 ** 31 + 7, 0, 4), f32)
    with pytest.raises(ValueError, match=r"attention_pooling_forward: x: .*" + LIMIT):
        _core.attention_pooling_forward(x=x, kernel=np.zeros((4, 1), f32), bias=np.zeros((1, 1), f32),
                                        return_sequences=True)
    pool = layers.AttentionPooling(return_sequences=True, length_agnostic=True)
    with pytest.raises(ValueError, match=LIMIT):
        pool(x)


@pytest.mark.parametrize("rows", [BIG, HUGE])
def test_conv_and_pooling_rows_past_int(rows):
    x = np.empty((1, rows, 0, 1), f32)  # no memory, yet rows x 0 pixels of one channel
    with pytest.raises(ValueError, match=r"conv2d_forward: x: shape \(1, \d+, 0, 1\) " + LIMIT):
        _core.conv2d_forward(x=x, kernel=np.zeros((1, 1, 1, 1), f32), bias=None, strides=(1, 1))
    for pool in (_core.max_pool2d_forward, _core.avg_pool2d_forward):
        with pytest.raises(ValueError, match=r"pool2d_forward: x: .*" + LIMIT):
            pool(x=x, pool_size=(1, 1), strides=(1, 1))
    with pytest.raises(ValueError, match=LIMIT):
        layers.MaxPooling2D(1, padding="same")(x)


def test_conv_patch_past_int():
    """A kernel of no filters (no memory) whose patches would hold 2**32 values."""
    with pytest.raises(ValueError, match=r"conv2d_forward: a patch of 65536x65536 pixels of 1 channels " + LIMIT):
        _core.conv2d_forward(x=np.zeros((1, 3, 3, 1), f32), kernel=np.empty((2 ** 16, 2 ** 16, 1, 0), f32), bias=None,
                             strides=(1, 1), padding="same")


def test_pooling_windows_and_strides_near_int_on_small_images():
    """'same' windows and strides of 2**31 - 1 on a 3x3 image (the padding arithmetic passes int)."""
    x = np.arange(18, dtype=f32).reshape(1, 3, 3, 2)
    top = 2 ** 31 - 1
    y = _core.max_pool2d_forward(x=x, pool_size=(top, top), strides=(top, top), padding="same")
    np.testing.assert_array_equal(y, x.max(axis=(1, 2), keepdims=True))
    y = _core.avg_pool2d_forward(x=x, pool_size=(1, 1), strides=(top, 2), padding="valid")
    np.testing.assert_array_equal(y, x[:, :1, ::2])
    with pytest.raises(ValueError, match="max_pool2d_forward: window 2147483647x2147483647 is larger than the input"):
        _core.max_pool2d_forward(x=x, pool_size=(top, top), strides=(1, 1))
    with pytest.raises(TypeError):  # past int: pybind11 refuses the conversion
        _core.max_pool2d_forward(x=x, pool_size=(2, 2), strides=(2 ** 31, 1))


def test_zero_stride_views_are_refused_not_read():
    """A broadcast view of one element posing as a (2**31 + 16, 4) array: refused by layout before
    any size is cast."""
    fake = np.lib.stride_tricks.as_strided(np.zeros(1, f32), shape=(BIG, 4), strides=(0, 0))
    with pytest.raises(ValueError, match="dense_forward: x: expected a C-contiguous array"):
        _core.dense_forward(x=fake, kernel=np.zeros((4, 1), f32), bias=None)
    fake_mask = np.broadcast_to(np.ones(1, bool), (2, BIG))
    with pytest.raises(ValueError, match=r"masked_softmax_forward: mask: expected shape \(2, 3\)"):
        _core.masked_softmax_forward(scores=np.zeros((2, 1, 1, 3), f32), mask=fake_mask)


def test_results_past_int_are_refused_before_allocating():
    """Small inputs whose (B, H, Tq, S) weights would hold 2.5e9 elements."""
    q = np.zeros((1, 50_000, 1), f32)
    with pytest.raises(ValueError, match=r"result of shape \(1, 1, 50000, 50000\) " + LIMIT):
        _core.sdpa_forward(query=q, key=q, value=q)


def test_zero_size_inputs_return_at_once():
    assert _core.activation_forward(x=np.empty((0, 5), f32), activation="softmax").shape == (0, 5)
    assert _core.masked_softmax_forward(scores=np.empty((0, 2, 3, 4), f32)).shape == (0, 2, 3, 4)
    y, _ = _core.dense_forward(x=np.empty((3, 0), f32), kernel=np.empty((0, 2), f32), bias=np.ones(2, f32))
    np.testing.assert_array_equal(y, np.ones((3, 2), f32))


# ------------------------------------------------------------------------- threads
def test_set_num_threads_is_capped_at_the_cpu_count():
    cpus, before = os.cpu_count(), _core.get_num_threads()
    try:
        with pytest.raises(ValueError, match=rf"set_num_threads: n must lie in \[1, {cpus}\].*got 5000"):
            _core.set_num_threads(n=5000)
        with pytest.raises(ValueError, match="got 0"):
            attnx.set_num_threads(0)
        _core.set_num_threads(n=cpus)
        assert _core.get_num_threads() == cpus
    finally:
        _core.set_num_threads(n=before)


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""), reason="ASan's quarantine holds freed memory")
def test_inference_scratch_does_not_outlive_its_threads():
    """Each thread that ran inference kept its scratch after it ended: layers held one set of
    buffers per thread, and malloc kept freed result blocks in the arena of the thread that freed
    them (two 32-thread bursts on a GRU(256) grew RSS by 930 and 1190 MiB). Results now come from
    the result cache (at most 128 MiB kept, or what one thread had live at once) and go back to the
    OS beyond it."""
    gru = layers.GRU(256, return_sequences=True)
    x = np.random.default_rng(0).normal(size=(32, 256, 64)).astype(f32)
    want = gru(x)
    before = _rss_bytes()
    for burst in range(2):
        outputs = []
        threads = [threading.Thread(target=lambda: outputs.append(gru(x))) for _ in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outputs) == 32
        for y in outputs:
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
        del outputs, y
        grown = (_rss_bytes() - before) / 2 ** 20
        assert grown < 300, f"RSS grew by {grown:.0f} MiB after {burst + 1} bursts of 32 inference threads"


def _minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_result_cache_keeps_the_shapes_in_use_after_other_shapes_filled_it():
    """Results of 64 KiB and more come from a cache of freed blocks (at most 128 MiB). Once a large
    model's results had filled it, a smaller model's blocks found no room: each of its results was
    fresh memory again (a BiLSTM step took 900 page faults and 7 ms instead of 4.8). The least
    recently freed blocks now make room."""
    big = np.ones(8 << 20, f32)  # 32 MiB of results each
    outputs = [_core.activation_forward(x=big, activation="relu") for _ in range(4)]
    del outputs  # the cache now holds 128 MiB of a shape nothing uses again
    small = np.full((256, 1024), -1.0, f32)  # 1 MiB: 256 pages
    for _ in range(3):
        y = _core.activation_forward(x=small, activation="relu")
        del y
    before = _minor_faults()
    for _ in range(10):
        y = _core.activation_forward(x=small, activation="relu")
        assert not y.any()
        del y
    faults = _minor_faults() - before
    assert faults < 256, f"{faults} page faults in 10 calls whose 1 MiB result the cache should have held"



def test_result_cache_holds_a_working_set_larger_than_its_floor():
    """The cache kept at most 128 MiB, so a loop whose results add up to more than that between one
    use of a shape and the next (a seq2seq step with V = 8000 frees about 150 MiB: logits, their
    gradient, the decoder's caches) met fresh memory every step: 12,000 page faults, 12 ms of a
    150 ms step. It now keeps as much as one thread has had live at once."""
    x = np.full(8 << 20, -1.0, f32)  # 32 MiB results: 8192 pages each

    def step():  # six results live together, 192 MiB, then all freed
        outputs = [_core.activation_forward(x=x, activation="relu") for _ in range(6)]
        assert not any(y.any() for y in outputs)

    step()
    before = _minor_faults()
    for _ in range(3):
        step()
    faults = _minor_faults() - before
    assert faults < 8192, f"{faults} page faults in 3 steps whose 192 MiB of results the cache should have held"

# ------------------------------------------------------------------------- raw seq2seq bindings
V, E, H, K, U = 7, 3, 4, 4, 3


def _params(vocab=V, out_vocab=V):
    r = np.random.default_rng(1)
    f = lambda *s: r.uniform(-0.5, 0.5, s).astype(f32)  # noqa: E731
    return {"embeddings": f(vocab, E), "kernel": f(E + K, 3 * H), "recurrent_kernel": f(H, 3 * H),
            "bias": f(2, 3 * H), "query_kernel": f(H, U), "query_bias": f(U), "key_kernel": f(K, U),
            "score_vector": f(U), "output_kernel": f(H, out_vocab), "output_bias": f(out_vocab)}


def _forward(B=2, S=3, T=2, params=None, ids=None, **kw):
    params = params or _params()
    ids = np.ones((B, T), np.int64) if ids is None else ids
    enc = np.random.default_rng(2).normal(size=(B, S, K)).astype(f32)
    out = _core.decoder_forward(kind="bahdanau", score="additive", cell="gru", ids=ids, enc=enc,
                                h0=np.zeros((B, H), f32), params=params, **kw)
    return out, enc, params


def _backward(cache, enc, params, B=2, T=2):
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    return _core.decoder_backward(cache=cache, dlogits=np.ones((B, T, V), f32), enc=enc, params=params,
                                  grads=grads)


@pytest.mark.parametrize("extra", [1, 2, 1000])
def test_decoder_search_output_vocabulary_must_fit_the_embedding_table(extra):
    params = _params(vocab=V, out_vocab=V + extra)
    with pytest.raises(ValueError, match=rf"search_attention_decoder: the output vocabulary .*{V + extra} columns\) "
                                         rf"exceeds the embedding table's {V} rows"):
        _core.search_attention_decoder(kind="bahdanau", score="additive", cell="gru", enc=np.zeros((2, 3, K), f32),
                                       h0=np.zeros((2, H), f32), params=params, start_id=1, end_id=2, width=1,
                                       length_penalty=0.0, max_length=4, return_attention=False)


def test_decoder_backward_accepts_its_own_cache():
    (_, _, _, _, _, _, cache), enc, params = _forward()
    denc, dh0, dc0 = _backward(cache, enc, params)
    assert denc.shape == enc.shape and np.isfinite(denc).all() and dc0 is None


def test_decoder_backward_refuses_a_cache_of_other_sizes():
    """A cache from a B=1, S=2 call with a (64, 30, K) encoder output (heap-use-after-free before)."""
    (_, _, _, _, _, _, cache), _, params = _forward(B=1, S=2)
    enc = np.zeros((64, 30, K), f32)
    with pytest.raises(ValueError, match=r'decoder_backward: cache\["\w+"\]: expected shape'):
        _backward(cache, enc, params, B=64)


@pytest.mark.parametrize("name", ["gates", "weights", "score_hidden", "emb"])
def test_decoder_backward_refuses_shrunken_cache_buffers(name):
    (_, _, _, _, _, _, cache), enc, params = _forward()
    cache[name] = np.ascontiguousarray(cache[name][..., :1])
    with pytest.raises(ValueError, match=rf'decoder_backward: cache\["{name}"\]: expected shape'):
        _backward(cache, enc, params)


@pytest.mark.parametrize("bad, exc, pattern", [
    (lambda ids: ids.astype(np.int8), TypeError, r'cache\["ids"\]: expected dtype int64, got int8'),
    (lambda ids: ids + 100, IndexError, r'cache\["ids"\]: token id 101 out of range \[0, 7\)'),
    (lambda ids: ids - 2, IndexError, r'cache\["ids"\]: token id -1 out of range'),
    (lambda ids: ids.astype(np.float32), TypeError, r"expected dtype int64, got float32"),
    (lambda ids: "ids", ValueError, r'cache\["ids"\]: expected an array'),
], ids=["int8", "too_large", "negative", "float32", "str"])
def test_decoder_backward_refuses_bad_cached_ids(bad, exc, pattern):
    (_, _, _, _, _, _, cache), enc, params = _forward()
    cache["ids"] = bad(cache["ids"])
    with pytest.raises(exc, match=pattern):
        _backward(cache, enc, params)


@pytest.mark.parametrize("config", [None, (1, 2), ("bahdanau", "additive", "gru", "x", "m", 0), 5])
def test_decoder_backward_refuses_a_crafted_config(config):
    (_, _, _, _, _, _, cache), enc, params = _forward()
    if config is None:
        del cache["config"]
    else:
        cache["config"] = config
    with pytest.raises(ValueError, match=r'decoder_backward: cache\["config"\]'):
        _backward(cache, enc, params)


def test_decoder_backward_refuses_missing_buffers():
    (_, _, _, _, _, _, cache), enc, params = _forward()
    del cache["h_prev"]
    with pytest.raises(ValueError, match=r'cache\["h_prev"\]: missing'):
        _backward(cache, enc, params)


@pytest.mark.parametrize("ids, exc, pattern", [
    (np.ones((2, 2), np.int8), TypeError, r"decoder_forward: ids: expected a C-contiguous, aligned int64"),
    (np.full((2, 2), V, np.int64), IndexError, r"decoder_forward: ids: token id 7 out of range \[0, 7\)"),
    (np.ones((2, 4), np.int64)[:, ::2], TypeError, r"decoder_forward: ids: expected a C-contiguous"),
], ids=["int8", "out_of_range", "strided"])
def test_decoder_forward_ids(ids, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _forward(ids=ids)


def _misaligned_int64(shape):
    raw = np.zeros(np.prod(shape) * 8 + 1, np.uint8)
    out = raw[1:].view(np.int64).reshape(shape)
    assert not out.flags.aligned and out.flags.c_contiguous
    return out


def test_misaligned_int64_ids_are_refused_not_read():
    ids = _misaligned_int64((2, 2))
    ids[...] = 1
    with pytest.raises(TypeError, match="decoder_forward: ids: .*aligned int64.*misaligned"):
        _forward(ids=ids)
    with pytest.raises(TypeError, match="embedding_forward: ids: .*misaligned"):
        _core.embedding_forward(ids=ids, table=np.zeros((3, 2), f32))


@pytest.mark.parametrize("first_step", [2 ** 31 - 1, 2 ** 31 - 2])
def test_decoder_first_step_overflow(first_step):
    with pytest.raises(ValueError, match=r"decoder_forward: first_step must lie in \[0, 2\*\*31 - 1 - T\]"):
        _forward(first_step=first_step)
    _forward(first_step=2 ** 31 - 3)  # the last target position is 2**31 - 2: fine


def test_decoder_first_step_negative():
    with pytest.raises(ValueError, match="first_step must lie in"):
        _forward(first_step=-1)


# ------------------------------------------------------------------------- optional arguments as lists
@pytest.mark.parametrize("call", [
    lambda: _core.dense_forward(x=np.ones((2, 2)), kernel=np.ones((2, 2)), bias=[1.0, 2.0]),
    lambda: _core.layernorm_forward(x=np.ones((2, 2)), gamma=[1.0, 1.0], beta=None, eps=1e-5),
    lambda: _core.sdpa_forward(query=np.ones((1, 2, 2)), key=np.ones((1, 3, 2)), value=np.ones((1, 3, 2)),
                               dropout_keep=np.ones((1, 1, 2, 3)).tolist()),
    lambda: _core.rnn_forward(cell="gru", x=np.ones((1, 2, 2)), kernel=np.ones((2, 6)),
                              recurrent_kernel=np.ones((2, 6)), bias=[0.0] * 6, recurrent_bias=None, h0=None,
                              c0=None, mask=None, recurrent_mask=None),
    lambda: _core.mean_squared_error(pred=np.ones((2, 2)), target=np.ones((2, 2)), weights=[1.0, 1.0], denom=1.0),
    lambda: _core.conv2d_forward(x=np.ones((1, 2, 2, 1)), kernel=np.ones((1, 1, 1, 2)), bias=[1.0, 2.0],
                                 strides=(1, 1)),
], ids=["dense_bias", "layernorm_gamma", "sdpa_dropout_keep", "rnn_bias", "mse_weights", "conv_bias"])
def test_optional_array_arguments_given_as_lists(call):
    """A list where an optional array goes was converted to a temporary float64 array that was freed
    before the kernel read it (use after free in a float64 call): now a TypeError."""
    with pytest.raises(TypeError, match=r": expected a NumPy array, got list"):
        call()
