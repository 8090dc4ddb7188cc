"""attnx's one random stream (attnx.random, cpp/include/attnx/random.hpp): the kernels at every SIMD
level, the SeedGenerator's contract, every layer that draws (repeatable from its seed, and a batch
cut into shards drawing the rows of the whole batch, as data-parallel ranks do), the shuffle, and a
scan that fails if a second generator appears in python/attnx."""
import re
from pathlib import Path

import numpy as np
import pytest

import attnx
from attnx import _core, layers, random
from attnx.seq2seq import BahdanauDecoder

PACKAGE = Path(attnx.__file__).resolve().parent
F32 = np.dtype("float32")


@pytest.fixture(autouse=True)
def _fresh_stream():
    attnx.set_random_seed(11)
    yield
    random.shard_rows(0, 0)


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_stream_kernels_are_the_same_at_every_simd_level(dtype):
    got = {}
    try:
        for level in ("baseline", "avx2", "avx512"):
            _core._force_simd_level(level)
            got[level] = (_core.random_keep([37, 1029], 0.3, 5, 3, np.dtype(dtype)),
                          _core.random_uniform([37, 1029], 6, 3, np.dtype(dtype)))
    finally:
        _core._force_simd_level("avx512")
    for keep, u in got.values():
        np.testing.assert_array_equal(keep, got["baseline"][0])
        np.testing.assert_array_equal(u, got["baseline"][1])
    keep, u = got["baseline"]
    assert set(np.unique(keep)) == {0.0, np.dtype(dtype).type(1 / 0.7)}
    assert abs((keep == 0).mean() - 0.3) < 0.01
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_rows_drawn_apart_equal_the_rows_drawn_together():
    whole = _core.random_keep([10, 7, 3], 0.5, 9, 0, F32)
    parts = [_core.random_keep([k, 7, 3], 0.5, 9, first, F32) for first, k in ((0, 4), (4, 1), (5, 5))]
    np.testing.assert_array_equal(whole, np.concatenate(parts))
    assert not np.array_equal(whole[:4], _core.random_keep([4, 7, 3], 0.5, 9, 1, F32))  # the row index matters


def test_stream_kernels_refuse_bad_arguments():
    with pytest.raises(ValueError, match="random_keep: rate must be in"):
        _core.random_keep([3], 1.0, 1, 0, F32)
    with pytest.raises(TypeError, match="random_uniform: expected dtype float32 or float64"):
        _core.random_uniform([3], 1, 0, np.dtype("int32"))
    with pytest.raises(ValueError, match="negative size"):
        _core.random_keep([-1], 0.5, 1, 0, F32)
    with pytest.raises(TypeError):
        _core.random_fold_in(-1, 0)  # keys are uint64


# ----------------------------------------------------------------------------- SeedGenerator
def _keys(generator, n=3):
    return [generator.next_key() for _ in range(n)]


def test_draws_are_a_pure_function_of_seed_step_generator_and_draw():
    attnx.set_random_seed(3)
    a, b = random.SeedGenerator(), random.SeedGenerator()
    first = _keys(a)
    assert len(set(first)) == 3 and set(first).isdisjoint(_keys(b))  # draws and generators differ
    random.next_step()
    assert set(_keys(a)).isdisjoint(first)  # a new step, new draws
    attnx.set_random_seed(3)
    a2 = random.SeedGenerator()
    assert _keys(a2) == first  # the same seed, the same generator number: the same draws
    state = random.get_state()
    later = _keys(a2)
    random.set_state(state)
    assert _keys(a2) == later[:0] + first  # a restored state draws again from the step's first draw
    own = random.SeedGenerator(5)
    mine = _keys(own)
    attnx.set_random_seed(99)
    assert _keys(random.SeedGenerator(5)) == mine  # an own seed does not depend on the global one


@pytest.mark.parametrize("seed", [-1, 2 ** 64, 1.5, "3", True])
def test_a_bad_seed_is_a_value_error_naming_the_layer(seed):
    with pytest.raises(ValueError, match=r"Dropout: seed must be an integer in \[0, 2\*\*64\)"):
        layers.Dropout(0.5, seed=seed)
    with pytest.raises(ValueError, match="set_random_seed: seed must be"):
        attnx.set_random_seed(seed)


def test_set_state_checks_its_argument():
    with pytest.raises(ValueError, match="expected a dict with 'seed' and 'step'"):
        random.set_state({"seed": 1})
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        random.set_state({"seed": 1, "step": -2})


# ----------------------------------------------------------------------------- every layer that draws
def _qv(b):
    rng = np.random.default_rng(b)
    return [rng.normal(size=(b, 4, 6)).astype("float32"), rng.normal(size=(b, 5, 6)).astype("float32")]


def _seq(b):
    return np.random.default_rng(b).normal(size=(b, 4, 6)).astype("float32")


def _decoder_inputs(b):
    rng = np.random.default_rng(b)
    return [rng.integers(0, 9, (b, 4)), rng.normal(size=(b, 5, 6)).astype("float32"),
            rng.normal(size=(b, 7)).astype("float32")]


# (factory(seed), inputs(batch)) of every public layer that draws in training
DRAWING_LAYERS = {
    "Dropout": (lambda s: layers.Dropout(0.4, seed=s), _seq),
    "Dropout(noise_shape=(1, None, None))": (lambda s: layers.Dropout(0.4, noise_shape=(1, None, None), seed=s), _seq),
    "SpatialDropout1D": (lambda s: layers.SpatialDropout1D(0.4, seed=s), _seq),
    "SimpleRNN": (lambda s: layers.SimpleRNN(5, dropout=0.3, recurrent_dropout=0.3, return_sequences=True, seed=s),
                  _seq),
    "GRU(num_layers=2)": (lambda s: layers.GRU(5, dropout=0.3, recurrent_dropout=0.3, num_layers=2, stack_dropout=0.3,
                                               return_sequences=True, seed=s), _seq),
    "LSTM": (lambda s: layers.LSTM(5, dropout=0.3, recurrent_dropout=0.3, return_sequences=True, seed=s), _seq),
    "Bidirectional(LSTM)": (lambda s: layers.Bidirectional(layers.LSTM(5, dropout=0.3, return_sequences=True,
                                                                       seed=s)), _seq),
    "Attention": (lambda s: layers.Attention(dropout=0.4, seed=s), _qv),
    "AdditiveAttention": (lambda s: layers.AdditiveAttention(dropout=0.4, seed=s), _qv),
    "HardAttention": (lambda s: layers.HardAttention(seed=s), _qv),
    "MultiHeadAttention": (lambda s: layers.MultiHeadAttention(2, 3, dropout=0.4, seed=s), _qv),
    "FeedForward": (lambda s: layers.FeedForward(8, dropout=0.4, seed=s), _seq),
    "TransformerEncoderLayer": (lambda s: layers.TransformerEncoderLayer(2, 8, dropout=0.3, seed=s), _seq),
    "TransformerDecoderLayer": (lambda s: layers.TransformerDecoderLayer(2, 8, dropout=0.3, seed=s), _qv),
    "TransformerEncoder": (lambda s: layers.TransformerEncoder(2, 2, 8, dropout=0.3, seed=s), _seq),
    "BahdanauDecoder(hard)": (lambda s: BahdanauDecoder(9, 4, 7, hard=True, soft_fraction=0.0, seed=s),
                              _decoder_inputs),
}


def _call(layer, inputs, training):
    if isinstance(layer, layers.MultiHeadAttention):
        return layer(inputs[0], inputs[1], training=training)
    return layer(inputs, training=training)


def _flat(y):
    return np.concatenate([np.ravel(np.asarray(a, dtype=np.float64)) for a in (y if isinstance(y, list) else [y])])


def _at_step(step, fn):
    random.set_state({"seed": 11, "step": step})
    return fn()


@pytest.mark.parametrize("name", list(DRAWING_LAYERS))
def test_a_batch_cut_into_shards_draws_the_rows_of_the_whole_batch(name):
    """What data-parallel ranks rest on: rows [lo, hi) of a batch, told where they start, get the
    outputs rows lo..hi of the whole batch get in the same training step."""
    factory, make = DRAWING_LAYERS[name]
    layer, x = factory(None), make(7)
    inference = _flat(_call(layer, x, False))
    whole = _at_step(4, lambda: _call(layer, x, True))
    assert not np.allclose(_flat(whole), inference), "the training call drew nothing"
    pieces = []
    for lo, hi in ((0, 3), (3, 4), (4, 7)):
        random.shard_rows(lo, hi - lo)
        part = [a[lo:hi] for a in x] if isinstance(x, list) else x[lo:hi]
        pieces.append(_at_step(4, lambda: _call(layer, part, True)))
    random.shard_rows(0, 0)
    if isinstance(whole, list):
        whole, pieces = whole[0], [p[0] for p in pieces]
    np.testing.assert_allclose(np.concatenate(pieces), whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in DRAWING_LAYERS if not n.startswith("Bidirectional")])  # a wrapper
def test_a_layer_with_a_seed_draws_the_same_in_every_copy_and_step_by_step_anew(name):
    factory, make = DRAWING_LAYERS[name]
    layer, x = factory(5), make(6)
    first = _at_step(2, lambda: _flat(_call(layer, x, True)))
    assert layer.get_config()["seed"] == 5
    twin = type(layer).from_config(layer.get_config())
    _call(twin, x, False)
    twin.set_weights(layer.get_weights())
    attnx.set_random_seed(1234)  # an own seed: the global one does not matter
    np.testing.assert_array_equal(_at_step(2, lambda: _flat(_call(twin, x, True))), first)
    assert not np.array_equal(_at_step(3, lambda: _flat(_call(twin, x, True))), first)  # the next step
    other = type(layer).from_config({**layer.get_config(), "seed": 6})
    _call(other, x, False)
    other.set_weights(layer.get_weights())
    assert not np.array_equal(_at_step(2, lambda: _flat(_call(other, x, True))), first)


# ----------------------------------------------------------------------------- the shuffle
def test_the_shuffle_is_drawn_from_the_stream_at_the_step_a_pass_starts():
    from attnx.data_adapter import DataAdapter
    x, y = np.arange(20.0)[:, None], np.arange(20.0)[:, None]

    def orders(epochs):
        data = DataAdapter("fit", x, y, batch_size=20, shuffle=True, training=True)
        return [np.concatenate([b.x[:, 0] for b in data.epoch()]) for _ in range(epochs)]

    attnx.set_random_seed(2)
    first = orders(3)
    assert random.step() == 3  # one step per training batch
    assert all(sorted(o) == list(range(20)) for o in first)
    assert not np.array_equal(first[0], first[1])
    attnx.set_random_seed(2)
    assert all(np.array_equal(a, b) for a, b in zip(orders(3), first))
    random.set_state({"seed": 2, "step": 1})  # where a resumed run would be: the second pass again
    np.testing.assert_array_equal(orders(1)[0], first[1])


# ----------------------------------------------------------------------------- one generator
# Files that may hold NumPy generators: initial weights, synthetic data sets and test inputs, which
# are not training draws (attnx.random's docstring); everything else draws from attnx.random.
NUMPY_GENERATOR_HOMES = {"random.py", "datasets.py", "hierarchical.py", "testing.py", "text.py"}
SECOND_GENERATOR = re.compile(r"np\.random|numpy\.random|default_rng|splitmix|\bPCG64\b|random\.Random|"
                              r"^\s*import random\b|^\s*from random import", re.MULTILINE)
DRAWS_OUTSIDE_THE_STREAM = re.compile(r"backend\.rng\(\)\.(random|integers|permutation|shuffle|choice|"
                                      r"standard_normal|binomial)")


def test_no_second_generator_in_the_package():
    """One random stream: no file of python/attnx but the listed homes makes a NumPy generator (or any
    other), and no file draws training randomness from `backend.rng()` (initializers' weights only)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        relative = path.relative_to(PACKAGE).as_posix()
        if relative not in NUMPY_GENERATOR_HOMES and SECOND_GENERATOR.search(text):
            offenders.append(f"{relative}: {SECOND_GENERATOR.search(text).group(0)!r}")
        if DRAWS_OUTSIDE_THE_STREAM.search(text):
            offenders.append(f"{relative}: {DRAWS_OUTSIDE_THE_STREAM.search(text).group(0)!r}")
    assert not offenders, "a second random generator: " + "; ".join(offenders)
    cpp = Path(__file__).resolve().parents[1] / "cpp"  # the source tree: the installed package has no C++
    mixers = [p.relative_to(cpp).as_posix() for p in cpp.rglob("*.hpp") if "mix64(" in p.read_text()]
    assert sorted(mixers) == ["include/attnx/random.hpp", "reference/random.hpp"]


def test_the_scan_finds_a_second_generator(tmp_path):
    """The scan above can fail: it flags the forms a second generator takes."""
    for line in ("rng = np.random.default_rng(0)", "keep = backend.rng().random(shape) > rate",
                 "import random", "u = splitmix64(seed)"):
        assert SECOND_GENERATOR.search(line) or DRAWS_OUTSIDE_THE_STREAM.search(line), line
