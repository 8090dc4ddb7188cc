"""attnx's one random stream (ARCHITECTURE.md, "Randomness"), JAX's PRNGKey / fold_in idea.

Every random number training draws (dropout, SpatialDropout1D, recurrent and attention dropout, the
transformer layers' dropout, hard attention's samples, the epoch shuffle) is a pure function of

    (the seed, the training step, the draw within the step, the global row, the element)

computed in C++ (`cpp/include/attnx/random.hpp`, through `attnx.kernels`). Hence:

- `attnx.set_random_seed(s)` makes a run repeatable; the step counter (`step()`, advanced by each of
  `fit`'s batches) and the seed are all the state there is, so `BackupAndRestore` resumes a run bit
  for bit by saving `get_state()`;
- a batch cut into shards draws exactly the rows of the whole batch: a data-parallel rank tells the
  stream where its shard starts (`shard_rows`), so N ranks draw the masks one process draws;
- nothing depends on thread counts or on the order in which independent layers run.

A layer that draws holds a `SeedGenerator` (Keras' name): with `seed=` its draws depend on that seed
and its own draws alone (not on `set_random_seed`); without one, a draw's place among the step's
draws identifies the layer call, as in one NumPy stream drawn in call order: the same in every
process running the same program (ranks, a resumed run, a model and its loaded copy). Initial weights and synthetic data are not training draws: they come from the
NumPy generator `numpy_generator()`, seeded by `set_random_seed` too.
"""
import secrets
import threading

import itertools

import numpy as np

from . import kernels

# sub-stream tags: a layer's own seed, the global seed's layers, the shuffle
_OWN_SEED, _GLOBAL_SEED, _SHUFFLE = 1, 2, 3

_state = {"seed": secrets.randbits(63), "step": 0}
# bumped whenever the state is set or the step moves: a generator's draws within a step count from
# the last bump, so a state set again (a resume, a test) draws again what it drew
_era = {"n": 0, "draws": 0}  # draws: the draws without an own seed since the bump
_numpy = {"generator": np.random.default_rng()}
_shard = {"first": 0, "rows": 0}  # this process's share of the global batch: first global row, row count
_lock = threading.Lock()


def set_seed(seed):
    """Seeds every random choice attnx makes (`attnx.set_random_seed`): the stream, its step (back to
    0) and `numpy_generator()`."""
    seed = as_seed(seed, "set_random_seed")
    _state.update(seed=seed, step=0)
    _bump()
    _numpy["generator"] = np.random.default_rng(seed)


def numpy_generator():
    """The NumPy generator of initial weights and synthetic data (not of training draws)."""
    return _numpy["generator"]


def as_seed(seed, where):
    """`seed` as a non-negative int, else ValueError naming `where`."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 64:
        raise ValueError(f"{where}: seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def step():
    """The training step the stream is at (the batches `fit` has trained since the seed was set)."""
    return _state["step"]


def next_step():
    """Moves the stream to the next training step (`fit` calls it once per batch)."""
    _state["step"] += 1
    _bump()


def get_state():
    """The stream's whole state, JSON-able: ``{"seed", "step"}``."""
    return dict(_state)


def set_state(state):
    """Puts the stream where `get_state` found it (a resumed run, or every rank at rank 0's)."""
    if not isinstance(state, dict) or set(state) != {"seed", "step"}:
        raise ValueError(f"random.set_state: expected a dict with 'seed' and 'step', got {state!r}")
    seed = as_seed(state["seed"], "random.set_state")
    count = state["step"]
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"random.set_state: step must be a non-negative integer, got {count!r}")
    _state.update(seed=seed, step=int(count))
    _bump()


def _bump():
    with _lock:
        _era.update(n=_era["n"] + 1, draws=0)


def shard_rows(first, rows):
    """The batches this process trains are rows [first, first + rows) of the global batch (data
    parallelism); (0, 0): the whole batch, as one process."""
    _shard.update(first=int(first), rows=int(rows))


def _first_row(leading):
    """The global row of row 0 of a draw whose first axis has `leading` rows: a layer that folds
    each sample into k rows (batch-major) has k rows per sample."""
    rows = _shard["rows"]
    if rows and leading % rows == 0:
        return _shard["first"] * (leading // rows)
    return 0


def permutation(n):
    """The epoch shuffle: a permutation of range(n) drawn at the current step, the same on every
    rank (it draws one uniform per sample, sorted). Returns (order, key); `permutation_for(n, key)`
    redraws it."""
    key = kernels.random_fold_in(key=_global_key(_SHUFFLE), data=_state["step"])
    return permutation_for(n, key), key


def permutation_for(n, key):
    u = kernels.random_uniform(shape=[int(n)], key=int(key), first_row=0, dtype=np.dtype(np.float64))
    return np.argsort(u, kind="stable")


def uniforms(key):
    """An endless stream of float uniforms in [0, 1) from `key` (block b of 1024 from fold_in(key, b)): for
    draws whose count is not known up front, such as `attnx.data.Dataset.shuffle`'s buffer."""
    for block in itertools.count():
        block_key = kernels.random_fold_in(key=int(key), data=block)
        yield from kernels.random_uniform(shape=[1024], key=block_key, first_row=0, dtype=np.dtype(np.float64)).tolist()


def sub_seed(seed, k):
    """The seed of a composite layer's k-th drawing sublayer (None without a seed)."""
    return None if seed is None else kernels.random_fold_in(key=as_seed(seed, "sub_seed"), data=k)


def _global_key(tag):
    return kernels.random_fold_in(key=_state["seed"], data=tag)


class SeedGenerator:
    """The draws of one layer (Keras' `keras.random.SeedGenerator`): a draw of training step s is the
    sub-stream fold_in(fold_in(base, s), k): base from the layer's `seed` and k its k-th draw of the
    step, or without a seed, base from the global seed and k the draw's place among all draws of the
    step without one (counted from the step's start, or from the last `set_state`).

    Args:
        seed: an integer in [0, 2**64), or None (the global seed's stream).
        where: the layer's name, for errors.
    """

    def __init__(self, seed=None, where="SeedGenerator"):
        self.seed = None if seed is None else as_seed(seed, where)
        self._era, self._draws = None, 0

    def next_key(self):
        """The key of this generator's next draw."""
        with _lock:
            if self.seed is None:
                draw = _era["draws"]
                _era["draws"] += 1
            else:
                if self._era != _era["n"]:
                    self._era, self._draws = _era["n"], 0
                draw = self._draws
                self._draws += 1
        if self.seed is not None:
            base = kernels.random_fold_in(key=_OWN_SEED, data=self.seed)
        else:
            base = _global_key(_GLOBAL_SEED)
        return kernels.random_fold_in(key=kernels.random_fold_in(key=base, data=_state["step"]), data=draw)

    def keep(self, shape, rate, dtype, per_row=True):
        """Inverted dropout's scaled keep mask of `shape` (entries 0 or 1 / (1 - rate)). `per_row`:
        the first axis is the batch's rows (or k rows per sample), drawn by global row; False for a
        mask shared by every row (a noise shape of batch size 1)."""
        rate, key, first = self.keep_stream(shape[0] if per_row and len(shape) else None, rate)
        return kernels.random_keep(shape=[int(s) for s in shape], rate=rate, key=key, first_row=first,
                                   dtype=np.dtype(dtype))

    def keep_stream(self, rows, rate):
        """The next `keep` draw as ``(rate, key, first_row)``, for a kernel that draws the mask itself as
        it uses it (`dropout_stream` of `kernels.sdpa_forward`): rows the batch's rows of its first axis,
        or None for a mask shared by every row."""
        return float(rate), self.next_key(), _first_row(int(rows)) if rows is not None else 0

    def uniform(self, shape, dtype, per_row=True):
        """Uniforms in [0, 1) of `shape` (rows as in `keep`)."""
        shape = [int(s) for s in shape]
        first = _first_row(shape[0]) if per_row and shape else 0
        return kernels.random_uniform(shape=shape, key=self.next_key(), first_row=first, dtype=np.dtype(dtype))

    def permutation(self, n):
        """A permutation of range(n), the same on every rank (`permutation_for`)."""
        return permutation_for(n, self.next_key())

    def normal(self, shape, dtype):
        """Standard normals of `shape` (rows as in `keep`), by Box and Muller from two uniforms each."""
        u = self.uniform(tuple(shape) + (2,), np.float64)
        z = np.sqrt(-2.0 * np.log1p(-u[..., 0])) * np.cos(2.0 * np.pi * u[..., 1])
        return z.astype(dtype)
