"""Property-based fuzzing (hypothesis) of every public layer, loss, optimizer, pad_sequences and the
raw `attnx._core` entry points.

The property, for every case: the call either computes the same result as on the contiguous
float32 version of its input (and, where a NumPy reference exists, the right result), or raises
one of the documented exceptions (ValueError, TypeError, IndexError, RuntimeError). Anything else
- another exception type, a crash, a hang (faulthandler aborts after HANG_SECONDS), a result of the
wrong shape or a silent broadcast - fails.

Runs are deterministic (`derandomize=True`). ATTNX_FUZZ_EXAMPLES=<n> raises the number of examples
per test (default 25) for a bigger budget on demand:

    ATTNX_FUZZ_EXAMPLES=500 PYTHONPATH=python python -m pytest tests/test_fuzz.py -q

(ATTNX_FUZZ_REPORT=<file> writes how many calls were checked.)

Adding a layer: append a `LayerCase` to LAYER_CASES (a factory drawing its hyperparameters, a
generator of one valid input, and optionally a NumPy reference and the mask argument it takes);
every generic property below then runs on it.
"""
import faulthandler
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnx
from attnx import _core, layers, losses, optimizers
from attnx.text import pad_sequences

EXAMPLES = int(os.environ.get("ATTNX_FUZZ_EXAMPLES", "25"))
HANG_SECONDS = 120
DOCUMENTED = (ValueError, TypeError, IndexError, RuntimeError)

FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None, print_blob=True,
                suppress_health_check=list(HealthCheck))


CALLS = {"checked": 0}  # calls whose outcome was checked; ATTNX_FUZZ_REPORT=<file> writes the count


@pytest.fixture(scope="module", autouse=True)
def _report_calls():
    yield
    if os.environ.get("ATTNX_FUZZ_REPORT"):
        with open(os.environ["ATTNX_FUZZ_REPORT"], "w") as f:
            f.write(f"{CALLS['checked']} fuzzed calls checked\n")


@pytest.fixture(autouse=True)
def _no_hang():
    """A hang in a kernel becomes a failed run with every thread's traceback, not a stuck CI job."""
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True, file=sys.__stderr__)  # not the capture
    yield
    faulthandler.cancel_dump_traceback_later()


# ------------------------------------------------------------------------------- helpers
def outcome(fn):
    """('ok', result) or ('err', exception) for a documented exception; anything else propagates."""
    CALLS["checked"] += 1
    try:
        return "ok", fn()
    except DOCUMENTED as exc:
        return "err", exc


def assert_same(got, want, rtol=1e-5, atol=1e-6, msg=""):
    """Same structure, shapes and values (NaN where the reference has NaN)."""
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w, rtol, atol, msg)
        return
    if want is None:
        assert got is None
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{msg}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                               equal_nan=True, err_msg=msg)


def floats(draw, shape, lo=-3.0, hi=3.0):
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32)


def unaligned(x):
    """A writable C-contiguous copy of x whose data pointer is not aligned to its itemsize."""
    x = np.asarray(x)
    buf = np.zeros(x.nbytes + 1, np.uint8)
    out = np.frombuffer(buf.data, dtype=x.dtype, offset=1, count=x.size).reshape(x.shape)
    out[...] = x
    assert not out.flags.aligned or x.itemsize == 1
    return out


def layout_variants(x):
    """Arrays (or nested lists) holding the same values as x in other layouts and dtypes."""
    x = np.asarray(x)
    out = {"fortran": np.asfortranarray(x), "float64": x.astype(np.float64),
           "unaligned": unaligned(x) if x.size else x}
    if x.size:  # a nested list of a zero-size array loses its trailing axes
        out["list"] = x.tolist()
    ro = x.copy()
    ro.flags.writeable = False
    out["readonly"] = ro
    if x.ndim:
        out["strided"] = np.repeat(x, 2, axis=-1)[..., ::2]
        out["reversed"] = np.ascontiguousarray(x[::-1])[::-1]
        out["reversed_last"] = np.ascontiguousarray(x[..., ::-1])[..., ::-1]
        if x.shape[0]:
            out["broadcast"] = np.broadcast_to(x[:1], x.shape)  # zero stride, read-only
    return out


BAD_DTYPES = {
    "bool": lambda x: np.asarray(x) > 0,
    "object": lambda x: np.asarray(x).astype(object),
    "complex": lambda x: np.asarray(x).astype(np.complex64),
    "str": lambda x: np.asarray(x).astype(str),
    "datetime": lambda x: np.zeros(np.shape(x), dtype="datetime64[s]"),
}


# --------------------------------------------------------------------- NumPy references
def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def np_activation(name, x):
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        if name == "linear":
            return x
        if name == "relu":
            return np.where(x < 0, 0.0, x)  # NaN stays NaN
        if name == "tanh":
            return np.tanh(x)
        if name == "sigmoid":
            return 0.5 * (1 + np.tanh(0.5 * x))
        if name == "gelu":
            return x * 0.5 * (1 + _erf(x / math.sqrt(2)))
        if name == "softmax":
            if x.shape[-1] == 0:
                return x
            top = np.max(x, axis=-1, keepdims=True)
            e = np.exp(x - top)
            out = e / e.sum(axis=-1, keepdims=True)
            # DESIGN: a row with nothing to attend to (all -inf, i.e. fully masked) gives zeros, never NaN
            return np.where(top == -np.inf, 0.0, out)
    raise AssertionError(name)


# ---------------------------------------------------------------------------- layer table
@dataclass
class LayerCase:
    """One fuzzed layer: `make(draw)` builds it, `sample(draw, layer)` gives one valid input
    (an array, or a list of arrays for merge layers), `ref(layer, x)` the expected output (None
    when there is no NumPy reference; the layout properties still apply). `ids`: the input is
    token ids. `ranks`: input ranks the layer accepts (None: any >= 1)."""
    make: Callable
    sample: Callable
    ref: Optional[Callable] = None
    ids: bool = False
    ranks: Optional[list] = None  # accepted ranks of each input, e.g. [(2, 3), (3,)]; None: any (ref decides)
    multi_input: bool = False
    mask: bool = False  # takes `mask=`
    mask_kinds: tuple = ("bool", "int01", "lengths")  # good mask kinds it accepts (others must raise)
    mask_arg: Callable = lambda x, m: m  # the call's `mask=` argument for a (B, T) mask m
    mask_bt: Callable = lambda x: np.shape(x)[:2]  # (B, T) that masks of input x have
    before_backward: Callable = lambda layer, x: None  # e.g. HardAttention's set_reward


def _shape(draw, rank, features=None, zero_ok=True):
    """Batch 1..3, time 1..4, other axes 0..4 (0 only when zero_ok)."""
    dims = [draw(st.sampled_from([1, 2, 3]))]
    for i in range(1, rank):
        if i == rank - 1 and features is not None:
            dims.append(features)
        else:
            dims.append(draw(st.sampled_from([1, 2, 4] + ([0] if zero_ok else []))))
    return tuple(dims)


ACTS = ["linear", "relu", "tanh", "sigmoid", "softmax", "gelu"]


def _dense(draw):
    return layers.Dense(draw(st.sampled_from([1, 3, 5])), activation=draw(st.sampled_from(ACTS)),
                        use_bias=draw(st.booleans()))


def _dense_sample(draw, layer):
    feats = layer.extra_features if hasattr(layer, "extra_features") else draw(st.sampled_from([0, 1, 3]))
    layer.extra_features = feats
    return floats(draw, _shape(draw, draw(st.sampled_from([2, 3])), features=feats))


def _dense_ref(layer, x):
    z = np.asarray(x, np.float64) @ layer.params["kernel"].astype(np.float64)
    if layer.use_bias:
        z = z + layer.params["bias"]
    return np_activation(layer.activation, z)


def _embedding(draw):
    return layers.Embedding(draw(st.sampled_from([1, 2, 7])), draw(st.sampled_from([1, 4])),
                            mask_zero=draw(st.booleans()))


def _ids_sample(draw, layer):
    shape = _shape(draw, draw(st.sampled_from([1, 2])))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return np.random.default_rng(seed).integers(0, layer.input_dim, size=shape).astype(np.int64)


def _gap_ref(layer, x, mask=None):
    x = np.asarray(x, np.float64)
    if mask is None:
        return x.mean(axis=1) if x.shape[1] else np.zeros((x.shape[0], x.shape[2]))
    m = np.asarray(mask).astype(np.float64)
    return (x * m[:, :, None]).sum(axis=1) / np.maximum(m.sum(axis=1), 1)[:, None]


def _reshape(draw):
    return layers.Reshape(draw(st.sampled_from([(-1,), (2, -1), (-1, 2), (4,), (1, 4), (2, 2)])))


def _reshape_sample(draw, layer):
    return floats(draw, (draw(st.sampled_from([1, 2, 3])),) + draw(st.sampled_from([(4,), (2, 2), (1, 4, 1)])))


def _merge_sample(same_shape):
    def sample(draw, layer):
        rank = draw(st.sampled_from([2, 3]))
        base = _shape(draw, rank)
        xs = []
        for _ in range(draw(st.sampled_from([2, 3]))):
            shape = list(base)
            if not same_shape:
                shape[layer.axis % rank] = draw(st.sampled_from([0, 1, 3]))
            xs.append(floats(draw, tuple(shape)))
        return xs
    return sample


LAYER_CASES = {
    "Dense": LayerCase(_dense, _dense_sample, _dense_ref, ranks=None),
    "Embedding": LayerCase(_embedding, _ids_sample, lambda l, x: l.params["embeddings"][np.asarray(x, np.int64)],
                           ids=True),
    "Activation": LayerCase(lambda d: layers.Activation(d(st.sampled_from(ACTS))),
                            lambda d, l: floats(d, _shape(d, d(st.sampled_from([1, 2, 3])))),
                            lambda l, x: np_activation(l.activation, x)),
    "Dropout": LayerCase(lambda d: layers.Dropout(d(st.sampled_from([0.0, 0.5]))),
                         lambda d, l: floats(d, _shape(d, d(st.sampled_from([1, 2, 3])))),
                         lambda l, x: np.asarray(x, np.float64)),
    "Flatten": LayerCase(lambda d: layers.Flatten(), lambda d, l: floats(d, _shape(d, d(st.sampled_from([2, 3, 4])))),
                         lambda l, x: np.asarray(x, np.float64).reshape(np.shape(x)[0], -1)),
    "Reshape": LayerCase(_reshape, _reshape_sample,
                         lambda l, x: np.asarray(x, np.float64).reshape((np.shape(x)[0],) + l.target_shape)),
    "Concatenate": LayerCase(lambda d: layers.Concatenate(axis=d(st.sampled_from([-1, 1]))), _merge_sample(False),
                             lambda l, xs: np.concatenate([np.asarray(x, np.float64) for x in xs], axis=l.axis),
                             multi_input=True),
    "Add": LayerCase(lambda d: layers.Add(), _merge_sample(True),
                     lambda l, xs: sum(np.asarray(x, np.float64) for x in xs), multi_input=True),
    "Multiply": LayerCase(lambda d: layers.Multiply(), _merge_sample(True),
                          lambda l, xs: np.prod([np.asarray(x, np.float64) for x in xs], axis=0), multi_input=True),
    "SpatialDropout1D": LayerCase(lambda d: layers.SpatialDropout1D(d(st.sampled_from([0.0, 0.5]))),
                                  lambda d, l: floats(d, _shape(d, 3)), lambda l, x: np.asarray(x, np.float64),
                                  ranks=(3,)),
    "RepeatVector": LayerCase(lambda d: layers.RepeatVector(d(st.sampled_from([1, 3]))),
                              lambda d, l: floats(d, _shape(d, 2)),
                              lambda l, x: np.repeat(np.asarray(x, np.float64)[:, None], l.n, axis=1), ranks=(2,)),
    "Masking": LayerCase(lambda d: layers.Masking(), lambda d, l: floats(d, _shape(d, 3)),
                         lambda l, x: np.asarray(x, np.float64) * (np.asarray(x) != 0).any(-1, keepdims=True),
                         ranks=(3,)),
    "GlobalAveragePooling1D": LayerCase(lambda d: layers.GlobalAveragePooling1D(),
                                        lambda d, l: floats(d, _shape(d, 3)), _gap_ref, ranks=(3,), mask=True),
}


def _rnn(cls):
    def make(draw):
        return cls(draw(st.sampled_from([1, 3])), return_sequences=draw(st.booleans()),
                   go_backwards=draw(st.booleans()))
    return make


def _seq_sample(draw, layer):
    return floats(draw, _shape(draw, 3, features=draw(st.sampled_from([1, 2])), zero_ok=False))


def _cell_sample(draw, layer):
    return floats(draw, _shape(draw, 2, features=draw(st.sampled_from([1, 3]))))


def _attn_sample(draw, layer):
    B, D = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 4]))
    Tq, S = draw(st.sampled_from([1, 3])), draw(st.sampled_from([1, 2, 5]))
    return [floats(draw, (B, Tq, D)), floats(draw, (B, S, D))]


def _attn_case(make):
    return LayerCase(make, _attn_sample, multi_input=True, ranks=[(2, 3), (3,)], mask=True,
                     mask_arg=lambda x, m: [None, m], mask_bt=lambda x: np.shape(x[1])[:2])


def _hard_reward(layer, x):
    layer.set_reward(np.ones(np.shape(x[0])[0]))


RNN_MASK = dict(mask=True, ranks=[(3,)])
LAYER_CASES.update({
    "SimpleRNN": LayerCase(_rnn(layers.SimpleRNN), _seq_sample, **RNN_MASK),
    "GRU": LayerCase(_rnn(layers.GRU), _seq_sample, **RNN_MASK),
    "LSTM": LayerCase(_rnn(layers.LSTM), _seq_sample, **RNN_MASK),
    "Bidirectional": LayerCase(lambda d: layers.Bidirectional(_rnn(d(st.sampled_from(
        [layers.LSTM, layers.GRU, layers.SimpleRNN])))(d), merge_mode=d(st.sampled_from(["concat", "sum", "ave"]))),
        _seq_sample, **RNN_MASK),
    "SimpleRNNCell": LayerCase(lambda d: layers.SimpleRNNCell(d(st.sampled_from([1, 3]))), _cell_sample, ranks=[(2,)]),
    "GRUCell": LayerCase(lambda d: layers.GRUCell(d(st.sampled_from([1, 3]))), _cell_sample, ranks=[(2,)]),
    "LSTMCell": LayerCase(lambda d: layers.LSTMCell(d(st.sampled_from([1, 3]))), _cell_sample, ranks=[(2,)]),
    "Attention": _attn_case(lambda d: layers.Attention(score=d(st.sampled_from(
        ["dot", "scaled_dot", "general", "concat", "additive"])))),
    "AdditiveAttention": _attn_case(lambda d: layers.AdditiveAttention(use_scale=d(st.booleans()))),
    "BahdanauAdditiveAttention": _attn_case(lambda d: layers.BahdanauAdditiveAttention()),
    "LSTMN": LayerCase(_rnn(layers.LSTMN), _seq_sample, **RNN_MASK),
    "LuongAttention": _attn_case(lambda d: layers.LuongAttention(score=d(st.sampled_from(["general", "dot"])))),
    "LocalAttention": _attn_case(lambda d: layers.LocalAttention(window=d(st.sampled_from([0, 1, 3])),
                                                                 mode=d(st.sampled_from(["local-m", "local-p"])))),
    "HardAttention": LayerCase(lambda d: layers.HardAttention(), _attn_sample, multi_input=True,
                               ranks=[(2, 3), (3,)], before_backward=_hard_reward),
    "AttentionPooling": LayerCase(lambda d: layers.AttentionPooling(return_sequences=d(st.booleans()),
                                                                    length_agnostic=d(st.booleans())),
                                  _seq_sample, ranks=[(3,)], mask=True),
    "FilterbankRead": LayerCase(lambda d: layers.FilterbankRead(d(st.sampled_from([1, 3]))),
                                lambda d, l: [floats(d, (2, 5, 6)), floats(d, (2, 5))], multi_input=True,
                                ranks=[(3,), (2,)]),
    "FilterbankWrite": LayerCase(lambda d: layers.FilterbankWrite(5, 6),
                                 lambda d, l: [floats(d, (2, 3, 3)), floats(d, (2, 5))], multi_input=True,
                                 ranks=[(3,), (2,)]),
})


def _model_dim_sample(draw, layer):
    return floats(draw, _shape(draw, 3, features=draw(st.sampled_from([2, 4])), zero_ok=False))


def _enc_sample(draw, layer):
    return floats(draw, _shape(draw, 3, features=4, zero_ok=False))


def _dec_sample(draw, layer):
    B = draw(st.sampled_from([1, 2]))
    return [floats(draw, (B, draw(st.sampled_from([1, 3])), 4)), floats(draw, (B, draw(st.sampled_from([1, 2, 4])), 4))]


LAYER_CASES.update({
    "LayerNormalization": LayerCase(lambda d: layers.LayerNormalization(), _model_dim_sample,
                                    lambda l, x: _np_layernorm(l, x)),
    "PositionalEncoding": LayerCase(lambda d: layers.PositionalEncoding(), _model_dim_sample, ranks=[(3,)]),
    "PositionEmbedding": LayerCase(lambda d: layers.PositionEmbedding(4), _model_dim_sample, ranks=[(3,)]),
    "FeedForward": LayerCase(lambda d: layers.FeedForward(d(st.sampled_from([1, 3]))), _model_dim_sample,
                             ranks=[(2, 3, 4)]),  # position-wise: any (batch, ..., features)
    "MultiHeadAttention": LayerCase(lambda d: layers.MultiHeadAttention(d(st.sampled_from([1, 2])), 2),
                                    _attn_sample, multi_input=True, ranks=[(3,), (3,)]),
    "TransformerEncoderLayer": LayerCase(lambda d: layers.TransformerEncoderLayer(2, 3), _enc_sample, ranks=[(3,)]),
    "TransformerEncoder": LayerCase(lambda d: layers.TransformerEncoder(2, 2, 3), _enc_sample, ranks=[(3,)]),
    "TransformerDecoderLayer": LayerCase(lambda d: layers.TransformerDecoderLayer(2, 3), _dec_sample,
                                         multi_input=True, ranks=[(3,), (3,)]),
    "TransformerDecoder": LayerCase(lambda d: layers.TransformerDecoder(1, 2, 3), _dec_sample, multi_input=True,
                                    ranks=[(3,), (3,)]),
})


def _image_sample(draw, layer):
    """(B, H, W, C) images at least as large as the layer's window (C fixed once per layer)."""
    window = getattr(layer, "kernel_size", None) or layer.pool_size
    if not hasattr(layer, "sample_channels"):
        layer.sample_channels = draw(st.sampled_from([1, 3]))
    shape = (draw(st.sampled_from([1, 2])), window[0] + draw(st.sampled_from([0, 1, 4])),
             window[1] + draw(st.sampled_from([0, 2, 3])), layer.sample_channels)
    return floats(draw, shape)


IMAGE = dict(ranks=[(4,)])
LAYER_CASES.update({
    "Conv2D": LayerCase(lambda d: layers.Conv2D(d(st.sampled_from([1, 4])), d(st.sampled_from([1, 2, (3, 2)])),
                                                strides=d(st.sampled_from([1, 2, (1, 3)])),
                                                padding=d(st.sampled_from(["same", "valid"])),
                                                activation=d(st.sampled_from(ACTS)), use_bias=d(st.booleans())),
                        _image_sample, **IMAGE),
    "MaxPooling2D": LayerCase(lambda d: layers.MaxPooling2D(d(st.sampled_from([1, 2, (2, 3)])),
                                                            strides=d(st.sampled_from([None, 1, 2])),
                                                            padding=d(st.sampled_from(["same", "valid"]))),
                              _image_sample, **IMAGE),
    "AveragePooling2D": LayerCase(lambda d: layers.AveragePooling2D(d(st.sampled_from([1, 2, (2, 3)])),
                                                                    strides=d(st.sampled_from([None, 1, 2])),
                                                                    padding=d(st.sampled_from(["same", "valid"]))),
                                  _image_sample, **IMAGE),
})

def _seq_channels_sample(draw, layer):
    """(B, T, C) with T >= the layer's window and C fixed once per layer (Conv1D)."""
    if not hasattr(layer, "sample_channels"):
        layer.sample_channels = draw(st.sampled_from([1, 2, 4]))
    span = getattr(layer, "_span", 1)
    return floats(draw, (draw(st.sampled_from([1, 2, 3])), span + draw(st.sampled_from([0, 1, 3])),
                         layer.sample_channels))


def _gmp_ref(layer, x, mask=None):
    x = np.asarray(x, np.float64)
    if mask is None:
        return x.max(axis=1)
    m = np.asarray(mask, bool)[:, :, None]
    return np.where(m.any(axis=1), np.where(m, x, -np.inf).max(axis=1), 0.0)


def _dot_ref(layer, xs):
    """Keras' batch dot over the last axes, sample by sample."""
    a, b = (np.asarray(x, np.float64) for x in xs)
    out = np.stack([np.tensordot(a[i], b[i], (-1, -1)) for i in range(len(a))])
    return out[:, None] if out.ndim == 1 else out


LAYER_CASES.update({  # issue 41's layers
    "TimeDistributed": LayerCase(lambda d: layers.TimeDistributed(layers.Dense(d(st.sampled_from([1, 3])))),
                                 lambda d, l: floats(d, _shape(d, d(st.sampled_from([3, 4])), features=2,
                                                               zero_ok=False)),
                                 lambda l, x: np.asarray(x, np.float64) @ l.params["kernel"] + l.params["bias"]),
    "Lambda": LayerCase(lambda d: layers.Lambda(attnx.ops.tanh),
                        lambda d, l: floats(d, _shape(d, d(st.sampled_from([1, 2, 3])))),
                        lambda l, x: np.tanh(np.asarray(x, np.float64))),
    # momentum 1: the moving statistics stay (a training call moves them), so every call reads the same
    "BatchNormalization": LayerCase(lambda d: layers.BatchNormalization(momentum=1.0),
                                    lambda d, l: floats(d, _shape(d, d(st.sampled_from([2, 3])), features=3)),
                                    lambda l, x: np.asarray(x, np.float64) / np.sqrt(1 + l.epsilon), ranks=[(2, 3)]),
    "Conv1D": LayerCase(lambda d: layers.Conv1D(d(st.sampled_from([1, 4])), d(st.sampled_from([1, 2, 3])),
                                                padding=d(st.sampled_from(["same", "valid", "causal"])),
                                                dilation_rate=d(st.sampled_from([1, 2])),
                                                activation=d(st.sampled_from(ACTS))),
                        _seq_channels_sample, ranks=[(3,)], mask=True),
    "GlobalMaxPooling1D": LayerCase(lambda d: layers.GlobalMaxPooling1D(),
                                    lambda d, l: floats(d, _shape(d, 3, zero_ok=False)), _gmp_ref, ranks=(3,),
                                    mask=True),
    "GlobalAveragePooling2D": LayerCase(lambda d: layers.GlobalAveragePooling2D(),
                                        lambda d, l: floats(d, _shape(d, 4, zero_ok=False)),
                                        lambda l, x: np.asarray(x, np.float64).mean(axis=(1, 2)), ranks=[(4,)]),
    "Dot": LayerCase(lambda d: layers.Dot(axes=-1),
                     lambda d, l: [floats(d, s) for s in [_shape(d, 2, zero_ok=False)] * 2], _dot_ref,
                     multi_input=True, ranks=[(2,), (2,)]),
    "Permute": LayerCase(lambda d: layers.Permute((2, 1)), lambda d, l: floats(d, _shape(d, 3)),
                         lambda l, x: np.asarray(x, np.float64).transpose(0, 2, 1), ranks=[(3,)]),
})
CASE_NAMES = sorted(LAYER_CASES)


def _np_layernorm(layer, x):
    x = np.asarray(x, np.float64)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + layer.epsilon)
    if layer.scale:
        y = y * layer.params["gamma"]
    if layer.center:
        y = y + layer.params["beta"]
    return y


def _draw_case(data, name):
    case = LAYER_CASES[name]
    layer = case.make(data.draw)
    x = case.sample(data.draw, layer)
    return case, layer, x


def _check_ref(case, layer, x, y, **kw):
    if case.ref is not None:
        assert_same(y, case.ref(layer, x, **kw), rtol=1e-4, atol=1e-5)


def _first(y):
    return y[0] if isinstance(y, (list, tuple)) else y


def _documented_error(exc, layer):
    """Errors raised for a layer's input name the layer (DESIGN: errors name the layer)."""
    assert layer.name in str(exc), f"error does not name layer '{layer.name}': {exc!r}"


# ------------------------------------------------------------------------ layer properties
@pytest.mark.parametrize("name", CASE_NAMES)
@FUZZ
@given(data=st.data())
def test_layer_forward_layouts(name, data):
    """Every layout / dtype of the same values gives the contiguous float32 result."""
    case, layer, x = _draw_case(data, name)
    y = layer(x)
    _check_ref(case, layer, x, y)
    items = x if case.multi_input else [x]
    which = data.draw(st.integers(0, len(items) - 1))
    for vname, v in layout_variants(items[which]).items():
        if case.ids and vname == "float64":
            v = np.asarray(v, np.float64)  # integral floats are accepted as ids
        arg = list(items) if case.multi_input else v
        if case.multi_input:
            arg[which] = v
        kind, got = outcome(lambda: layer(arg))
        if kind == "err":
            _documented_error(got, layer)
            assert vname not in ("fortran", "float64", "readonly", "strided", "reversed"), \
                f"{vname} input rejected: {got!r}"
            continue
        want = y
        if vname == "broadcast":  # other values: compare with a contiguous copy of them
            copy = np.array(v, dtype=np.float32)
            want = layer([copy if i == which else a for i, a in enumerate(items)] if case.multi_input else copy)
        assert_same(got, want, msg=f"{vname} input")


@pytest.mark.parametrize("name", CASE_NAMES)
@FUZZ
@given(data=st.data())
def test_layer_bad_dtypes(name, data):
    case, layer, x = _draw_case(data, name)
    layer(x)
    items = x if case.multi_input else [x]
    bad = data.draw(st.sampled_from(sorted(BAD_DTYPES)))
    arg = [BAD_DTYPES[bad](v) for v in items] if case.multi_input else BAD_DTYPES[bad](x)
    kind, got = outcome(lambda: layer(arg))
    assert kind == "err" and isinstance(got, TypeError), f"{bad} input gave {got!r}"
    _documented_error(got, layer)


@pytest.mark.parametrize("name", CASE_NAMES)
@FUZZ
@given(data=st.data())
def test_layer_wrong_rank_or_shape(name, data):
    """Extra or missing axes, a scalar, an empty batch: a documented error, or (for layers that
    accept any rank) the reference result; never a silent broadcast."""
    case, layer, x = _draw_case(data, name)
    layer(x)
    items = x if case.multi_input else [x]
    op = data.draw(st.sampled_from(["add_axis", "drop_axis", "scalar", "empty_batch", "flatten", "add_lead"]))
    v = np.asarray(items[0])

    def mutate(a):
        a = np.asarray(a)
        return {"add_axis": lambda: a[..., None], "drop_axis": lambda: a[0], "scalar": lambda: a.reshape(-1)[:1].reshape(()) if a.size else np.float32(0),
                "empty_batch": lambda: a[:0], "flatten": lambda: a.reshape(-1),
                "add_lead": lambda: a[None]}[op]()
    if case.multi_input:
        arg = list(items)
        arg[data.draw(st.integers(0, len(arg) - 1))] = mutate(v)
    else:
        arg = mutate(v)
    kind, got = outcome(lambda: layer(arg))
    if kind == "err":
        _documented_error(got, layer)
        return
    # accepted: must be exactly the reference for that input, or a rank the layer documents
    assert op != "empty_batch" or np.shape(_first(got))[0] == 0
    if case.ref is None:
        assert case.ranks is not None and op != "empty_batch", f"{name} accepted a {op} input"
        args = arg if case.multi_input else [arg]
        assert all(np.ndim(a) in r for a, r in zip(args, case.ranks)), \
            f"{name} accepted a {op} input of shapes {[np.shape(a) for a in args]}"
        return
    _check_ref(case, layer, arg, got)


@pytest.mark.parametrize("name", CASE_NAMES)
@FUZZ
@given(data=st.data())
def test_layer_nonfinite_values(name, data):
    """NaN / inf inputs propagate like the reference (never hidden, never a crash)."""
    case, layer, x = _draw_case(data, name)
    if case.ids:  # non-finite or non-integral "ids" are a TypeError
        bad = np.asarray(x, np.float64)
        if bad.size:
            bad.reshape(-1)[0] = data.draw(st.sampled_from([np.nan, np.inf, 0.5]))
            kind, got = outcome(lambda: layer(bad))
            assert kind == "err" and isinstance(got, TypeError), got
        return
    items = [np.array(v) for v in (x if case.multi_input else [x])]
    for v in items:
        if v.size:
            flat = v.reshape(-1)
            for _ in range(data.draw(st.integers(1, 3))):
                # huge finite values overflow float32 where the float64 reference does not: only
                # where there is no reference (no crash, right shape)
                flat[data.draw(st.integers(0, flat.size - 1))] = data.draw(st.sampled_from(
                    [np.nan, np.inf, -np.inf] + ([np.float32(3e38), np.float32(-3e38)] if case.ref is None else [])))
    arg = items if case.multi_input else items[0]
    with np.errstate(all="ignore"):
        y = layer(arg)
        _check_ref(case, layer, arg, y)
        clean = layer(x)
        for a, b in zip(y if isinstance(y, list) else [y], clean if isinstance(clean, list) else [clean]):
            assert np.shape(a) == np.shape(b)


@pytest.mark.parametrize("name", CASE_NAMES)
@FUZZ
@given(data=st.data())
def test_layer_backward(name, data):
    """Gradients for dy in any layout equal the contiguous ones; a dy of the wrong shape (even a
    broadcastable one) raises ValueError; backward without a training forward is a RuntimeError."""
    case, layer, x = _draw_case(data, name)
    layer(x)
    layer.zero_grad()
    kind, exc = outcome(lambda: layer.backward(np.zeros(1, np.float32)))
    assert kind == "err" and isinstance(exc, RuntimeError), exc
    y = layer(x, training=True)
    multi_out = isinstance(y, (list, tuple))
    dys = [floats(data.draw, np.shape(o)) for o in (y if multi_out else [y])]
    dy = dys if multi_out else dys[0]

    def backward(d):
        case.before_backward(layer, x)
        return layer.backward(d if not multi_out else [d] + dys[1:])
    dx = backward(dys[0])
    grads = {k: g.copy() for k, g in layer.grads.items()}
    if case.multi_input:
        assert isinstance(dx, list) and [np.shape(d) for d in dx] == [np.shape(v) for v in x]
    elif dx is not None:
        assert np.shape(dx) == np.shape(x)
    for vname, v in layout_variants(dys[0]).items():
        layer.zero_grad()
        kind, got = outcome(lambda: backward(v))
        if kind == "err":
            if vname != "list":  # a list dy may mean [dy, dweights] to a layer: a documented error is fine
                _documented_error(got, layer)
                assert vname in ("unaligned", "broadcast"), f"{vname} dy rejected: {got!r}"
            continue
        if vname == "broadcast":
            continue  # other values; accepted without a crash is all this checks
        assert_same(got, dx, msg=f"dx for {vname} dy")
        for k in grads:
            assert_same(layer.grads[k], grads[k], msg=f"grad {k} for {vname} dy")
    # gradients accumulate
    layer.zero_grad()
    backward(dys[0])
    backward(dys[0])
    for k in grads:
        assert_same(layer.grads[k], 2 * grads[k], rtol=1e-4, atol=1e-5)
    wrong = data.draw(st.sampled_from(["add_axis", "drop_batch", "batch_one", "flat", "plus_one"]))
    shape = np.shape(dys[0])
    bad_shape = {"add_axis": shape + (1,), "drop_batch": shape[1:], "batch_one": (1,) + shape[1:],
                 "flat": (int(np.prod(shape)),), "plus_one": shape[:-1] + (shape[-1] + 1,)}[wrong]
    if tuple(bad_shape) != tuple(shape):
        kind, got = outcome(lambda: backward(np.ones(bad_shape, np.float32)))
        assert kind == "err" and isinstance(got, ValueError), f"dy {bad_shape} for output {shape}: {got!r}"
        _documented_error(got, layer)


class simd_level:
    """Runs the kernels' copies for at most `level` ("avx2": AVX2 + FMA, 8-float vectors;
    "baseline": x86-64, 4-float vectors, no FMA) inside the block, as on a CPU without the wider
    instructions; outside it they run the widest copies this CPU takes."""
    def __init__(self, level):
        self.level = level

    def __enter__(self):
        _core._force_simd_level(self.level)

    def __exit__(self, *exc):
        _core._force_simd_level("avx512")


_LEVELS = ["baseline", "avx2", "avx512"]
# the levels below this CPU's widest, each compared against the widest
NARROWER_LEVELS = _LEVELS[:_LEVELS.index(_core._config()["cpu_simd_level"])]


def _forward_backward(layer, x, dy_seed, before_backward=lambda layer, x: None):
    """(inference output, training output, input gradient, parameter gradients) with the same
    dropout draws on every call."""
    attnx.set_random_seed(0)
    y = layer(x)
    y_train = layer(x, training=True)
    rng = np.random.default_rng(dy_seed)
    outs = y_train if isinstance(y_train, (list, tuple)) else [y_train]
    dys = [rng.uniform(-1, 1, np.shape(o)).astype(np.float32) for o in outs]
    layer.zero_grad()
    before_backward(layer, x)
    dx = layer.backward(dys if isinstance(y_train, (list, tuple)) else dys[0])
    return y, y_train, dx, {k: g.copy() for k, g in layer.grads.items()}


@pytest.mark.parametrize("level", NARROWER_LEVELS)
@pytest.mark.parametrize("name", CASE_NAMES)
@FUZZ
@given(data=st.data())
def test_layer_simd_levels(name, level, data):
    """The narrower copies of the kernels (what a CPU without AVX-512, or without AVX2, runs) give
    the results of the widest, forward and backward, up to float rounding."""
    case, layer, x = _draw_case(data, name)
    if name == "Dropout":
        return  # no kernel of its own
    seed = data.draw(st.integers(0, 2 ** 32 - 1))
    want = _forward_backward(layer, x, seed, case.before_backward)
    with simd_level(level):
        got = _forward_backward(layer, x, seed, case.before_backward)
    for what, g, w in zip(["inference", "training", "dx"], got[:3], want[:3]):
        assert_same(g, w, rtol=1e-4, atol=1e-5, msg=what)
    for k in want[3]:
        assert_same(got[3][k], want[3][k], rtol=1e-4, atol=1e-5, msg=f"grad {k}")


@pytest.mark.parametrize("level", NARROWER_LEVELS)
@pytest.mark.parametrize("make, shapes", [
    # full register tiles and their tails: 32-column panels (64 for AVX-512), 3-row tiles, V used in place or packed
    (lambda: layers.MultiHeadAttention(2, 32), [(3, 37, 40), (3, 45, 40)]),
    (lambda: layers.MultiHeadAttention(2, 32), [(3, 70, 40), (3, 131, 40)]),
    (lambda: layers.MultiHeadAttention(3, 16, value_dim=20), [(2, 50, 24), (2, 35, 24)]),
    (lambda: layers.TransformerEncoderLayer(4, 96), [(2, 70, 64)]),
    (lambda: layers.TransformerDecoderLayer(3, 48), [(2, 50, 24), (2, 30, 24)]),  # causal self-attention
    (lambda: layers.LSTM(40, return_sequences=True), [(5, 9, 12)]),
    (lambda: layers.LSTM(100, return_sequences=True), [(7, 5, 20)]),  # 16-unit blocks and a tail of 4
    (lambda: layers.GRU(33, reset_after=False), [(7, 6, 10)]),
    (lambda: layers.Bidirectional(layers.SimpleRNN(17, return_sequences=True)), [(4, 8, 5)]),
    (lambda: layers.AttentionPooling(), [(6, 41, 24)]),
    # Dense on the tiles: one block on one thread (2^18..2^20 multiply-adds), and blocks split across threads
    (lambda: layers.Dense(70, activation="relu"), [(9, 17, 130)]),
    (lambda: layers.Dense(37, activation="gelu"), [(4, 700, 45)]),
    (lambda: layers.BahdanauAdditiveAttention(), [(3, 11, 24), (3, 43, 24)]),
    (lambda: layers.LuongAttention(), [(3, 11, 24), (3, 43, 24)]),
    (lambda: layers.Conv2D(40, 3, strides=(1, 2), padding="same", activation="relu"), [(3, 12, 11, 17)]),
    (lambda: layers.MaxPooling2D(3, strides=2, padding="same"), [(3, 12, 11, 37)]),
    (lambda: layers.AveragePooling2D((2, 3), strides=1), [(3, 12, 11, 37)]),
])
def test_kernels_simd_levels_at_tile_sizes(make, shapes, level):
    attnx.set_random_seed(1)
    layer = make()
    rng = np.random.default_rng(2)
    xs = [rng.uniform(-2, 2, s).astype(np.float32) for s in shapes]
    x = xs if len(xs) > 1 else xs[0]
    want = _forward_backward(layer, x, 3)
    with simd_level(level):
        got = _forward_backward(layer, x, 3)
    for what, g, w in zip(["inference", "training", "dx"], got[:3], want[:3]):
        assert_same(g, w, rtol=1e-4, atol=1e-5, msg=what)
    for k in want[3]:
        assert_same(got[3][k], want[3][k], rtol=1e-4, atol=2e-5, msg=f"grad {k}")


def test_layer_table_covers_every_public_layer():
    public = {n for n in layers.__all__ if n != "Layer"}
    assert public <= set(LAYER_CASES), f"add a LayerCase for {sorted(public - set(LAYER_CASES))}"


# -------------------------------------------------------------------------------- masks
def _masked_cases():
    return [n for n in CASE_NAMES if LAYER_CASES[n].mask]


@pytest.mark.parametrize("name", _masked_cases())
@FUZZ
@given(data=st.data())
def test_layer_masks(name, data):
    """Good masks (bool, 0/1 ints, lengths) give the reference; every wrong kind raises."""
    case, layer, x = _draw_case(data, name)
    B, T = case.mask_bt(x)
    seed = data.draw(st.integers(0, 2 ** 32 - 1))
    r = np.random.default_rng(seed)
    good = r.random((B, T)) < 0.6
    lengths = r.integers(0, T + 1, size=B)
    kind_of_mask = data.draw(st.sampled_from(
        ["bool", "int01", "lengths", "all_false", "readonly", "strided", "list",
         "wrong_T", "wrong_B", "transposed", "3d", "scalar", "float", "object", "str", "lengths_neg",
         "lengths_big", "lengths_2d", "lengths_float"]))
    expected = None
    if kind_of_mask == "bool":
        mask, expected = good, good
    elif kind_of_mask == "int01":
        mask, expected = good.astype(np.int32), good
    elif kind_of_mask == "lengths":
        mask, expected = lengths, np.arange(T)[None, :] < lengths[:, None]
    elif kind_of_mask == "all_false":
        mask, expected = np.zeros((B, T), bool), np.zeros((B, T), bool)
    elif kind_of_mask == "readonly":
        mask = good.copy()
        mask.flags.writeable = False
        expected = good
    elif kind_of_mask == "strided":
        mask, expected = np.repeat(good, 2, axis=1)[:, ::2], good
    elif kind_of_mask == "list":
        mask, expected = (good.tolist() if good.size else good), good
    else:
        mask = {"wrong_T": lambda: np.ones((B, T + 1), bool), "wrong_B": lambda: np.ones((B + 1, T), bool),
                "transposed": lambda: np.ones((T, B), bool) if T != B else np.ones((T, B, 1), bool),
                "3d": lambda: np.ones((B, T, 1), bool), "scalar": lambda: np.bool_(True),
                "float": lambda: good.astype(np.float32), "object": lambda: good.astype(object),
                "str": lambda: good.astype(str), "lengths_neg": lambda: lengths - T - 1,
                "lengths_big": lambda: lengths + T + 1, "lengths_2d": lambda: lengths[:, None],
                "lengths_float": lambda: lengths.astype(np.float32)}[kind_of_mask]()
    accepted_kind = {"int01": "int01", "lengths": "lengths", "list": "bool"}.get(kind_of_mask, "bool")
    if expected is not None and accepted_kind not in case.mask_kinds:
        expected = None  # this layer documents that kind as an error
    if expected is None and np.shape(mask) == (B, T) and np.asarray(mask).dtype.kind in "biu":
        return  # e.g. lengths[:, None] when T == 1: a valid (B, T) mask after all
    if expected is None and case.multi_input and np.asarray(mask).dtype.kind in "biu" and \
            np.shape(mask) == (B, np.shape(x[0])[1], T):
        return  # e.g. (T, B, 1) when B = T = Tq = 1: a valid per-query (B, Tq, S) attention mask after all
    kind, got = outcome(lambda: layer(x, mask=case.mask_arg(x, mask)))
    if expected is None:
        assert kind == "err", f"{kind_of_mask} mask {np.shape(mask)} accepted for masks of (B, T) = {(B, T)}"
        _documented_error(got, layer)
    else:
        assert kind == "ok", f"{kind_of_mask} mask rejected: {got!r}"
        if case.ref is not None:
            _check_ref(case, layer, x, got, mask=expected)
        else:  # same as the plain bool mask
            assert_same(got, layer(x, mask=case.mask_arg(x, np.array(expected, dtype=bool))))
        for out in (got if isinstance(got, list) else [got]):
            assert np.isfinite(out).all()  # a fully masked row gives zeros, never NaN


# --------------------------------------------------------------------------- Embedding ids
@FUZZ
@given(data=st.data())
def test_embedding_ids(data):
    layer = _embedding(data.draw)
    V = layer.input_dim
    ids = _ids_sample(data.draw, layer)
    want = layer(ids)
    for dtype in (np.int8, np.uint8, np.int16, np.int32, np.uint32, np.uint64, np.float32, np.float64):
        assert_same(layer(ids.astype(dtype)), want)
    bad = data.draw(st.sampled_from([V, V + 1, -1, -V - 1, 2 ** 40, np.iinfo(np.int64).min,
                                     np.iinfo(np.int64).max]))
    arr = ids.copy()
    if not arr.size:
        arr = np.zeros((1, 1), np.int64)
    arr.reshape(-1)[data.draw(st.integers(0, arr.size - 1))] = bad
    kind, got = outcome(lambda: layer(arr))
    assert kind == "err" and isinstance(got, IndexError), f"id {bad} for vocabulary {V}: {got!r}"
    assert str(V) in str(got) and layer.name in str(got)
    big = np.full(arr.shape, 2 ** 63 + 5, dtype=np.uint64)  # would wrap to a negative int64
    kind, got = outcome(lambda: layer(big))
    assert kind == "err" and isinstance(got, IndexError), got
    if layer.mask_zero:
        np.testing.assert_array_equal(layer.compute_mask(ids), ids != 0)


# ------------------------------------------------------------------------ merge layers
@FUZZ
@given(data=st.data())
def test_merge_layers_bad_lists(data):
    layer = data.draw(st.sampled_from([lambda: layers.Add(), lambda: layers.Concatenate(axis=-1),
                                       lambda: layers.Concatenate(axis=1)]))()
    shape = _shape(data.draw, 3, zero_ok=False)
    x = floats(data.draw, shape)
    kind_of = data.draw(st.sampled_from(["single", "one_item", "empty", "none_item", "rank_mismatch",
                                         "broadcastable", "tuple_ok", "axis_out_of_range"]))
    if kind_of == "axis_out_of_range":
        layer = layers.Concatenate(axis=data.draw(st.sampled_from([3, 4, -4, 7])))
        arg = [x, x]
    else:
        arg = {"single": lambda: x, "one_item": lambda: [x], "empty": lambda: [],
               "none_item": lambda: [x, None], "rank_mismatch": lambda: [x, x[..., 0]],
               "broadcastable": lambda: [x, np.concatenate([x, x])],  # batch B vs 2B (never the concat axis)
               "tuple_ok": lambda: (x, x)}[kind_of]()
    kind, got = outcome(lambda: layer(arg))
    if kind_of == "tuple_ok":
        assert kind == "ok", got
        want = x + x if isinstance(layer, layers.Add) else np.concatenate([x, x], axis=layer.axis)
        assert_same(got, want)
    else:
        assert kind == "err", f"{kind_of}: accepted, got shape {np.shape(got)}"
        _documented_error(got, layer)


# -------------------------------------------------------------------------------- losses
LOSS_CASES = {
    "bce": (lambda: losses.BinaryCrossentropy(), "prob"),
    "bce_logits": (lambda: losses.BinaryCrossentropy(from_logits=True), "binary"),
    "mse": (lambda: losses.MeanSquaredError(), "real"),
    "scce": (lambda: losses.SparseCategoricalCrossentropy(), "sparse_prob"),
    "scce_logits": (lambda: losses.SparseCategoricalCrossentropy(from_logits=True), "sparse"),
    "scce_ignore": (lambda: losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0), "sparse"),
    "cce": (lambda: losses.CategoricalCrossentropy(), "onehot_prob"),
    "cce_logits": (lambda: losses.CategoricalCrossentropy(from_logits=True), "onehot"),
}


def _loss_inputs(draw, kind):
    r = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    lead = _shape(draw, draw(st.sampled_from([1, 2])), zero_ok=False)
    K = draw(st.sampled_from([1, 2, 4]))
    if kind in ("prob", "binary", "real"):
        shape = lead + (draw(st.sampled_from([1, 3])),)
        pred = r.uniform(0.01, 0.99, shape) if kind == "prob" else r.normal(size=shape)
        target = r.integers(0, 2, shape).astype(np.float32) if kind != "real" else r.normal(size=shape)
    elif kind.startswith("sparse"):
        pred = r.normal(size=lead + (K,))
        if kind == "sparse_prob":
            pred = np.exp(pred) / np.exp(pred).sum(-1, keepdims=True)
        target = r.integers(0, K, lead)
    else:
        pred = r.normal(size=lead + (K,))
        if kind == "onehot_prob":
            pred = np.exp(pred) / np.exp(pred).sum(-1, keepdims=True)
        target = np.eye(K, dtype=np.float32)[r.integers(0, K, lead)]
    return pred.astype(np.float32), np.asarray(target), lead, K


def _np_loss(name, pred, target):
    """NumPy references (float64) for the from-logits and MSE losses."""
    p, t = np.asarray(pred, np.float64), np.asarray(target)
    if name == "mse":
        return np.mean((p - t) ** 2)
    if name == "bce_logits":
        return np.mean(np.maximum(p, 0) - p * t + np.log1p(np.exp(-np.abs(p))))
    lse = np.log(np.exp(p - p.max(-1, keepdims=True)).sum(-1)) + p.max(-1)
    if name == "cce_logits":
        return np.mean((t * (lse[..., None] - p)).sum(-1))
    if name in ("scce_logits", "scce_ignore"):
        picked = np.take_along_axis(p, t[..., None].astype(np.int64), -1)[..., 0]
        per = lse - picked
        if name == "scce_ignore":
            keep = t != 0
            return per[keep].sum() / max(keep.sum(), 1)
        return per.mean()
    return None


@pytest.mark.parametrize("name", sorted(LOSS_CASES))
@FUZZ
@given(data=st.data())
def test_loss_fuzz(name, data):
    make, kind = LOSS_CASES[name]
    loss = make()
    pred, target, lead, K = _loss_inputs(data.draw, kind)
    value, grad = loss.compute(target, pred)
    assert np.isfinite(value) and grad.shape == pred.shape and grad.dtype == pred.dtype
    want = _np_loss(name, pred, target)
    if want is not None:
        np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-5)
    # layouts of pred and target
    for vname, v in layout_variants(pred).items():
        if vname == "broadcast":
            continue  # other values (covered by the layer tests)
        kind_, got = outcome(lambda: loss.compute(target, v))
        if kind_ == "err":
            assert vname in ("unaligned", "broadcast") and isinstance(got, (ValueError, TypeError)), got
            continue
        np.testing.assert_allclose(got[0], value, rtol=1e-5, atol=1e-6)
        assert_same(got[1], grad)
    for vname, v in layout_variants(target).items():
        if vname == "broadcast":
            continue
        kind_, got = outcome(lambda: loss.compute(v, pred))
        if kind_ == "err":
            assert vname in ("unaligned", "broadcast"), f"{vname} target rejected: {got!r}"
            continue
        np.testing.assert_allclose(got[0], value, rtol=1e-5, atol=1e-6)
        assert_same(got[1], grad)
    # bad arguments: every one a documented error, never a broadcast
    bad = data.draw(st.sampled_from(["pred_int", "pred_bool", "pred_object", "target_object", "target_str",
                                     "target_extra_axis", "target_bcast_batch", "pred_scalar", "empty",
                                     "weight_shape", "mask_shape", "label_range", "labels_float"]))
    args = {"pred_int": lambda: (target, pred.astype(np.int32)), "pred_bool": lambda: (target, pred > 0.5),
            "pred_object": lambda: (target, pred.astype(object)), "target_object": lambda: (target.astype(object), pred),
            "target_str": lambda: (target.astype(str), pred),
            "target_extra_axis": lambda: (target[..., None, None], pred),
            "target_bcast_batch": lambda: (target[:1], pred) if lead[0] > 1 else (np.concatenate([target] * 2), pred),
            "pred_scalar": lambda: (target, np.float32(0.5)), "empty": lambda: (target[:0], pred[:0]),
            "weight_shape": lambda: (target, pred, np.ones(lead[0] + 1, np.float32), None),
            "mask_shape": lambda: (target, pred, None, np.ones(lead + (2,), bool)),
            "label_range": lambda: (np.full_like(target, K if kind.startswith("sparse") else 1) * (
                1 if kind.startswith("sparse") else -7), pred),
            "labels_float": lambda: (target.astype(np.float64) + 0.5, pred)}[bad]()
    kind_, got = outcome(lambda: loss.compute(*args))
    if bad == "label_range" and not kind.startswith("sparse"):
        return  # soft / out-of-range targets are valid numbers for non-sparse losses
    if bad == "labels_float" and not kind.startswith("sparse"):
        assert kind_ == "ok" and np.shape(got[1]) == pred.shape
        return
    assert kind_ == "err", f"{bad} accepted: loss {got[0] if isinstance(got, tuple) else got}"
    if bad == "label_range":
        assert isinstance(got, IndexError), got


@FUZZ
@given(data=st.data())
def test_loss_nonfinite_predictions_propagate(data):
    name = data.draw(st.sampled_from(["mse", "bce_logits", "scce_logits", "cce_logits"]))
    make, kind = LOSS_CASES[name]
    pred, target, lead, K = _loss_inputs(data.draw, kind)
    pred.reshape(-1)[data.draw(st.integers(0, pred.size - 1))] = data.draw(st.sampled_from([np.nan, np.inf]))
    with np.errstate(all="ignore"):
        value, grad = make().compute(target, pred)
    assert grad.shape == pred.shape
    if np.isnan(pred).any():
        assert np.isnan(value), f"{name}: NaN prediction gave loss {value}"


# ---------------------------------------------------------------------------- optimizers
OPTIMIZER_CASES = {
    "sgd": lambda: optimizers.SGD(learning_rate=0.1),
    "sgd_nesterov": lambda: optimizers.SGD(learning_rate=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda: optimizers.Adam(learning_rate=0.01),
    "adamw": lambda: optimizers.AdamW(learning_rate=0.01),
    "rmsprop": lambda: optimizers.RMSprop(learning_rate=0.01),
    "rmsprop_centered": lambda: optimizers.RMSprop(learning_rate=0.01, momentum=0.5, centered=True),
    "adam_clip": lambda: optimizers.Adam(learning_rate=0.01, clipvalue=0.5, global_clipnorm=None),
    "sgd_clipnorm": lambda: optimizers.SGD(learning_rate=0.1, clipnorm=0.3),
}


def np_optimizer_steps(name, params, grads_per_step):
    """Float64 NumPy reference of the update rules in attnx/optimizers.py."""
    ps = [p.astype(np.float64) for p in params]
    state = [[np.zeros_like(p) for _ in range(3)] for p in ps]
    for t, grads in enumerate(grads_per_step, start=1):
        for p, g, s in zip(ps, grads, state):
            g = g.astype(np.float64).copy()
            if name == "adam_clip":
                g = np.clip(g, -0.5, 0.5)
            if name == "sgd_clipnorm":
                n = np.sqrt((g ** 2).sum())
                if n > 0.3:
                    g *= 0.3 / n
            if name in ("sgd", "sgd_clipnorm"):
                p -= 0.1 * g
            elif name == "sgd_nesterov":
                g = g + 0.01 * p
                s[0][...] = 0.9 * s[0] + g
                p -= 0.1 * (g + 0.9 * s[0])
            elif name in ("adam", "adamw", "adam_clip"):
                if name == "adamw":
                    p *= 1 - 0.01 * 0.004
                b1, b2, eps = 0.9, 0.999, 1e-7
                s[0][...] = b1 * s[0] + (1 - b1) * g
                s[1][...] = b2 * s[1] + (1 - b2) * g * g
                p -= 0.01 / (1 - b1 ** t) * s[0] / (np.sqrt(s[1]) / np.sqrt(1 - b2 ** t) + eps)
            elif name == "rmsprop":
                s[0][...] = 0.9 * s[0] + 0.1 * g * g
                p -= 0.01 * g / (np.sqrt(s[0]) + 1e-7)
            elif name == "rmsprop_centered":
                s[0][...] = 0.9 * s[0] + 0.1 * g * g
                s[1][...] = 0.9 * s[1] + 0.1 * g
                denom = np.sqrt(s[0] - s[1] ** 2) + 1e-7
                s[2][...] = 0.5 * s[2] + g / denom
                p -= 0.01 * s[2]
    return ps


@pytest.mark.parametrize("name", sorted(OPTIMIZER_CASES))
@FUZZ
@given(data=st.data())
def test_optimizer_fuzz(name, data):
    n_params = data.draw(st.integers(1, 3))
    shapes = [tuple(data.draw(st.lists(st.sampled_from([0, 1, 2, 5]), min_size=1, max_size=3)))
              for _ in range(n_params)]
    params = [floats(data.draw, s) for s in shapes]
    steps = [[floats(data.draw, s) for s in shapes] for _ in range(data.draw(st.integers(1, 3)))]
    opt = OPTIMIZER_CASES[name]()
    live = [p.copy() for p in params]
    for grads in steps:
        opt.apply(list(zip(live, [g.copy() for g in grads])))
    want = np_optimizer_steps(name, params, steps)
    for got, w in zip(live, want):
        assert_same(got, w, rtol=2e-4, atol=2e-5)
    # bad pairs: a documented error and no partial update
    bad = data.draw(st.sampled_from(["grad_shape", "grad_dtype", "param_readonly", "param_strided",
                                     "grad_strided", "grad_readonly", "param_int", "grad_list", "grad_nan"]))
    p = floats(data.draw, (2, 3))
    g = floats(data.draw, (2, 3))
    before = p.copy()
    if bad == "grad_shape":
        g = g.reshape(3, 2)
    elif bad == "grad_dtype":
        g = g.astype(np.float64)
    elif bad == "param_readonly":
        p.flags.writeable = False
    elif bad == "param_strided":
        p = np.repeat(p, 2, axis=1)[:, ::2]
        before = p.copy()
    elif bad == "grad_strided":
        g = np.repeat(g, 2, axis=1)[:, ::2]
    elif bad == "grad_readonly":
        g.flags.writeable = False
    elif bad == "param_int":
        p = p.astype(np.int32)
        before = p.copy()
    elif bad == "grad_list":
        g = g.tolist()
    elif bad == "grad_nan":
        g[0, 0] = np.nan
    opt = OPTIMIZER_CASES[name]()
    kind, got = outcome(lambda: opt.apply([(p, g)]))
    if bad == "grad_nan":
        assert kind == "ok" and np.isnan(p[0, 0]) or name in ("adam_clip",), (kind, got)
        return
    if kind == "ok":
        # accepted: must be the same update as with a contiguous float32 gradient
        assert bad in ("grad_strided", "grad_readonly", "grad_list"), f"{bad} accepted"
        ref = before.copy()
        OPTIMIZER_CASES[name]().apply([(ref, np.ascontiguousarray(g, dtype=np.float32))])
        assert_same(p, ref)
    else:
        np.testing.assert_array_equal(p, before)


# ------------------------------------------------------------------------- pad_sequences
def _np_pad(seqs, maxlen, padding, truncating, value):
    maxlen = max((len(s) for s in seqs), default=0) if maxlen is None else maxlen
    out = np.full((len(seqs), maxlen), value, dtype=np.int32)
    for i, s in enumerate(seqs):
        if not len(s) or not maxlen:
            continue
        kept = s[-maxlen:] if truncating == "pre" else s[:maxlen]
        if padding == "post":
            out[i, :len(kept)] = kept
        else:
            out[i, maxlen - len(kept):] = kept
    return out


@FUZZ
@given(seqs=st.lists(st.lists(st.integers(-5, 100), max_size=6), min_size=1, max_size=5),
       maxlen=st.one_of(st.none(), st.integers(0, 8)), padding=st.sampled_from(["pre", "post"]),
       truncating=st.sampled_from(["pre", "post"]), value=st.integers(-1, 3),
       wrap=st.sampled_from(["list", "tuple", "arrays"]))
def test_pad_sequences_fuzz(seqs, maxlen, padding, truncating, value, wrap):
    arg = {"list": seqs, "tuple": tuple(tuple(s) for s in seqs),
           "arrays": [np.asarray(s, dtype=np.int64) for s in seqs]}[wrap]
    got = pad_sequences(arg, maxlen=maxlen, padding=padding, truncating=truncating, value=value)
    np.testing.assert_array_equal(got, _np_pad(seqs, maxlen, padding, truncating, value))
    assert got.dtype == np.int32


@FUZZ
@given(bad=st.sampled_from(["neg_maxlen", "float_maxlen", "bool_maxlen", "padding", "truncating", "not_list",
                            "item_scalar", "ragged_items", "str_value", "empty_no_maxlen"]))
def test_pad_sequences_bad_arguments(bad):
    kwargs, seqs = {}, [[1, 2], [3]]
    expected = ValueError
    if bad == "neg_maxlen":
        kwargs["maxlen"] = -1
    elif bad == "float_maxlen":
        kwargs["maxlen"], expected = 2.5, TypeError
    elif bad == "bool_maxlen":
        kwargs["maxlen"], expected = True, TypeError
    elif bad == "padding":
        kwargs["padding"] = "middle"
    elif bad == "truncating":
        kwargs["truncating"] = None
    elif bad == "not_list":
        seqs = 5
    elif bad == "item_scalar":
        seqs = [[1], 7]
    elif bad == "ragged_items":
        seqs = [[[1, 2]], [[1, 2, 3]]]
    elif bad == "str_value":
        kwargs["value"] = "pad"
    elif bad == "empty_no_maxlen":
        seqs = []
    with pytest.raises(expected):
        pad_sequences(seqs, **kwargs)


# --------------------------------------------------------------------- raw _core bindings
def _core_calls(draw):
    """name -> (function, builder of valid keyword arguments, names of in-place arguments)."""
    r = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    N, C, OC = draw(st.sampled_from([0, 1, 3])), draw(st.sampled_from([0, 1, 4])), draw(st.sampled_from([1, 2]))
    K = draw(st.sampled_from([1, 3]))
    f = lambda *s: r.normal(size=s).astype(np.float32)  # noqa: E731
    act = draw(st.sampled_from(ACTS))
    x, W, b = f(N, C), f(C, OC), f(OC)
    y, z = _core.dense_forward(x, W, b, act)
    ids = r.integers(0, 5, size=(N, 2)).astype(np.int64)
    table = f(5, OC)
    P = np.abs(f(N + 1, K)) + 0.1
    P /= P.sum(-1, keepdims=True)
    xl, gamma, beta = f(N, C + 1), f(C + 1), f(C + 1)
    _, mean, rstd = _core.layernorm_forward(xl, gamma, beta, 1e-5)
    return {
        "dense_forward": (_core.dense_forward, dict(x=x, kernel=W, bias=b, activation=act), ()),
        "dense_backward": (_core.dense_backward, dict(dy=f(N, OC), x=x, kernel=W, y=y, z=z, activation=act,
                                                      dkernel=np.zeros_like(W), dbias=np.zeros_like(b)),
                           ("dkernel", "dbias")),
        "activation_forward": (_core.activation_forward, dict(x=f(N, C), activation=act), ()),
        "activation_backward": (_core.activation_backward, dict(dy=y.copy(), x=z.copy(), y=y.copy(),
                                                                activation=act), ()),
        "embedding_forward": (_core.embedding_forward, dict(ids=ids, table=table), ()),
        "embedding_backward": (_core.embedding_backward, dict(dtable=np.zeros_like(table), dout=f(N, 2, OC),
                                                              ids=ids), ("dtable",)),
        "binary_crossentropy": (_core.binary_crossentropy, dict(pred=P, target=(P > 0.3).astype(np.float32),
                                                                weights=None, from_logits=False, denom=2.0), ()),
        "mean_squared_error": (_core.mean_squared_error, dict(pred=P, target=f(N + 1, K), weights=np.ones(
            (N + 1) * K, np.float32), denom=3.0), ()),
        "sparse_categorical_crossentropy": (_core.sparse_categorical_crossentropy, dict(
            pred=P, labels=r.integers(0, K, N + 1).astype(np.int64), weights=np.ones(N + 1, np.float32),
            from_logits=True, ignore_index=-100, denom=1.0), ()),
        "categorical_crossentropy": (_core.categorical_crossentropy, dict(
            pred=P, target=np.eye(K, dtype=np.float32)[r.integers(0, K, N + 1)], weights=None, from_logits=False,
            denom=1.0), ()),
        "sdpa_forward": (_core.sdpa_forward, dict(query=f(N, K, 2), key=f(N, OC + 1, 2), value=f(N, OC + 1, 3),
                                                  scale=0.5), ()),
        "layernorm_forward": (_core.layernorm_forward, dict(x=xl, gamma=gamma, beta=beta, eps=1e-5), ()),
        "layernorm_backward": (_core.layernorm_backward, dict(dy=f(N, C + 1), x=xl, mean=mean, rstd=rstd, gamma=gamma,
                                                              dgamma=np.zeros_like(gamma), dbeta=np.zeros_like(beta)),
                               ("dgamma", "dbeta")),
        "attention_pooling_forward": (_core.attention_pooling_forward, dict(x=f(N, K, C + 1), kernel=f(C + 1, 1),
                                                                            bias=f(1, 1)), ()),
    }


def _mutations(value, inplace):
    """Wrong variants of one array argument and whether a correct call could accept them."""
    v = np.asarray(value)
    out = {"object": v.astype(object), "bool": v > 0, "int32": v.astype(np.int32), "add_axis": v[..., None],
           "none": None, "float16": v.astype(np.float16)}
    if v.size:
        out["unaligned"] = unaligned(v)
    if v.dtype == np.float32:
        out["float64"] = v.astype(np.float64)
    if v.ndim:
        out["drop_axis"] = v[0] if v.shape[0] else np.zeros(v.shape[1:], v.dtype)
        out["plus_one"] = np.zeros(v.shape[:-1] + (v.shape[-1] + 1,), v.dtype)
        if v.shape[-1] > 1 and v.size:  # (an empty array counts as contiguous)
            out["strided"] = np.repeat(v, 2, axis=-1)[..., ::2]
        if v.shape[0] > 1 and v.size:
            out["reversed"] = np.ascontiguousarray(v[::-1])[::-1]
    ro = v.copy()
    ro.flags.writeable = False
    out["readonly"] = ro
    return out


# arguments whose shape the others do not pin down (any rank / any class count)
SHAPE_FREE = {("activation_forward", "x"), ("embedding_forward", "ids"), ("embedding_forward", "table"),
              ("sparse_categorical_crossentropy", "pred"), ("sparse_categorical_crossentropy", "labels"),
              ("sdpa_forward", "value")}
OPTIONAL = ("weights", "dbias", "bias", "gamma", "beta", "dgamma", "dbeta")  # None is a legitimate value
CORE_NAMES = ["dense_forward", "dense_backward", "activation_forward", "activation_backward", "embedding_forward",
              "embedding_backward", "binary_crossentropy", "mean_squared_error", "sparse_categorical_crossentropy",
              "categorical_crossentropy", "sdpa_forward", "layernorm_forward", "layernorm_backward",
              "attention_pooling_forward"]


@pytest.mark.parametrize("name", CORE_NAMES)
@FUZZ
@given(data=st.data())
def test_core_binding_arguments(name, data):
    """Each array argument of each binding replaced by a wrong one: a documented error, or (for a
    read-only argument given in another layout that holds the same values) the same result."""
    fn, kwargs, inplace = _core_calls(data.draw)[name]
    arrays = [k for k, v in kwargs.items() if isinstance(v, np.ndarray)]
    arg = data.draw(st.sampled_from(arrays))
    muts = _mutations(kwargs[arg], arg in inplace)
    mut = data.draw(st.sampled_from(sorted(muts)))
    fresh = lambda kw: {k: (v.copy() if isinstance(v, np.ndarray) and k in inplace else v) for k, v in kw.items()}  # noqa: E731
    base = fresh(kwargs)
    want = fn(**base)
    bad = fresh(kwargs)
    bad[arg] = muts[mut]
    if arg in OPTIONAL and mut == "none":
        return  # optional arguments
    kind, got = outcome(lambda: fn(**bad))
    if kind == "err":
        return
    if mut in ("add_axis", "drop_axis", "plus_one") and (
            (mut == "add_axis" and np.shape(kwargs[arg])[-1:] == (1,)) or (name, arg) in SHAPE_FREE
            or arg == "weights"):  # loss weights: one per element or row, checked by count
        return  # (..., 1) -> (..., 1, 1), or an argument of free shape: a legitimate call
    # accepted: must equal the valid call (only possible for value-preserving variants of inputs)
    same_values = mut in ("readonly", "reversed", "float64") or (mut == "unaligned")
    assert same_values and arg not in inplace, f"{name}: {arg} as {mut} accepted"
    assert_same(got, want)
    for k in inplace:
        assert_same(bad[k], base[k])


@FUZZ
@given(data=st.data())
def test_core_optimizer_bindings(data):
    """The raw optimizer entry points reject mismatched lists, dtypes and layouts."""
    r = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    shapes = [(2, 3), (4,)]
    p = [r.normal(size=s).astype(np.float32) for s in shapes]
    g = [r.normal(size=s).astype(np.float32) for s in shapes]
    m = [np.zeros(s, np.float32) for s in shapes]
    v = [np.zeros(s, np.float32) for s in shapes]
    bad = data.draw(st.sampled_from(["short", "dtype", "shape", "strided", "readonly", "not_list", "step0",
                                     "mixed_dtype", "obj"]))
    if bad == "short":
        g = g[:1]
    elif bad == "dtype":
        g = [a.astype(np.float64) for a in g]
    elif bad == "shape":
        g = [g[0], np.zeros(5, np.float32)]
    elif bad == "strided":
        m = [np.repeat(m[0], 2, axis=1)[:, ::2], m[1]]
    elif bad == "readonly":
        p[0].flags.writeable = False
    elif bad == "not_list":
        g = 3.0
    elif bad == "mixed_dtype":
        p = [p[0], p[1].astype(np.float64)]
    elif bad == "obj":
        v = [a.astype(object) for a in v]
    before = [a.copy() for a in p]
    step = 0 if bad == "step0" else 1
    kind, got = outcome(lambda: _core.adam_update(p, g, m, v, 0.1, 0.9, 0.999, 1e-7, step, 0.0, False))
    assert kind == "err", f"{bad} accepted"
    for a, b in zip(p, before):
        np.testing.assert_array_equal(a, b)
    for fn_name in ("global_norm", "scale_", "clip_"):
        kind, got = outcome(lambda: {"global_norm": lambda: _core.global_norm([np.zeros(3, np.int64)]),
                                     "scale_": lambda: _core.scale_([before[0][:, ::2]], 2.0),
                                     "clip_": lambda: _core.clip_([np.zeros(2, object)], 0.0, 1.0)}[fn_name]())
        assert kind == "err", fn_name


# --------------------------------------------------------------------- huge-but-valid sizes
def test_large_valid_sizes():
    """Large vocabularies, long sequences, wide rows and many rows: right results, no overflow."""
    r = np.random.default_rng(0)
    emb = layers.Embedding(300_000, 2)
    ids = np.array([[0, 299_999, 150_000]])
    np.testing.assert_array_equal(emb(ids), emb.params["embeddings"][ids])
    x = r.normal(size=(1, 200_000)).astype(np.float32)
    assert_same(layers.Activation("softmax")(x), np_activation("softmax", x), rtol=1e-4, atol=1e-9)
    dense = layers.Dense(3)
    xs = r.normal(size=(120_000, 1)).astype(np.float32)
    assert_same(dense(xs), _dense_ref(dense, xs), rtol=1e-4, atol=1e-5)
    lstm = layers.LSTM(4, return_sequences=True)
    seq = r.normal(size=(1, 1500, 2)).astype(np.float32)
    y = lstm(seq)
    assert y.shape == (1, 1500, 4) and np.isfinite(y).all()
    np.testing.assert_array_equal(lstm(seq[:, :10])[:, :10], y[:, :10])  # a prefix does not see the future


# -------------------------------------------------------- regressions the fuzzer found (fixed)
def test_regression_unaligned_arrays():
    """C-contiguous but misaligned buffers: the bindings refuse them (reading them is undefined
    behaviour and crashed the vectorized kernels); layers and losses pass aligned copies."""
    x = unaligned(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert not x.flags.aligned
    with pytest.raises(ValueError, match="aligned"):
        _core.activation_forward(x, "relu")
    assert_same(layers.Activation("relu")(x), np.array(x))
    assert_same(attnx.activations.tanh(x), np.tanh(np.array(x)))
    pred = unaligned(np.full((3, 2), 0.5, np.float32))
    assert np.isclose(losses.MeanSquaredError()(np.zeros((3, 2)), pred), 0.25)
    ids = unaligned(np.array([[1, 2]], np.int64))
    with pytest.raises(TypeError):
        _core.embedding_forward(ids, np.ones((3, 2), np.float32))
    emb = layers.Embedding(3, 2)
    assert_same(emb(ids), emb.params["embeddings"][[[1, 2]]])


def test_regression_nan_propagates_through_relu_and_softmax():
    x = np.array([[np.nan, 1.0, -1.0], [np.nan, np.nan, np.nan], [np.nan, -np.inf, -np.inf]], np.float32)
    assert np.isnan(_core.activation_forward(x, "relu")[:, 0]).all()
    assert np.isnan(_core.activation_forward(x, "softmax")).all()  # not the zeros of a fully masked row
    masked = np.full((1, 3), -np.inf, np.float32)
    assert (_core.activation_forward(masked, "softmax") == 0).all()


def test_regression_zero_sizes_and_axes():
    dense = layers.Dense(2)
    assert_same(dense(np.zeros((3, 0), np.float32)), np.broadcast_to(dense.params["bias"], (3, 2)))
    gap = layers.GlobalAveragePooling1D()
    assert_same(gap(np.zeros((2, 0, 3), np.float32)), np.zeros((2, 3)))
    with pytest.raises(TypeError, match="mask"):
        gap(np.ones((1, 2, 3), np.float32), mask=np.array([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        layers.Concatenate(axis=3)([np.ones((1, 2, 2), np.float32)] * 2)


def test_regression_luong_backward_without_attentional_units():
    layer = layers.LuongAttention(score="general")
    q, v = np.ones((2, 1, 3), np.float32), np.ones((2, 4, 3), np.float32)
    y = layer([q, v], training=True)
    dq, dv = layer.backward(np.ones_like(y))
    assert dq.shape == q.shape and dv.shape == v.shape
