"""A deterministic mutation fuzzer over every binding of `attnx._core` (issue 43): the seed corpus is
recorded from real calls (every public layer forward and backward, the losses, optimizers, decoders,
int8, bfloat16, the random stream), then each recorded call is replayed with one argument mutated
(shape, dtype, layout, values, type) in a child process. Every mutated call must return or raise
ValueError / TypeError / IndexError / RuntimeError: never another exception type, a signal or a hang.

Under `scripts/sanitize.sh` (gcc's ASan + UBSan build) the same loop checks memory safety: a read past
a buffer is an ASan report, which aborts the child. The budget is ATTNX_FUZZ_KERNEL_MUTATIONS per
recorded call (default 80: about 9,000 calls, seconds in the plain build); the mutations are the same
in every run (seeded by the binding's name). A crash that corrupts the heap may surface only when the
child exits: the child's exit status is checked, not only its last call.

Found so far: `decoder_backward` wrote an embedding gradient of fewer rows than the table past its end
(heap corruption, seen at exit): now a ValueError (`test_decoder_backward_checks_the_gradient_table`).
"""
import os
import pickle
import subprocess
import sys
import zlib

import numpy as np
import pytest

import attnx
import test_fuzz_loaders
import test_layer_contract
from attnx import _core, decoding, kernels, layers

MUTATIONS = int(os.environ.get("ATTNX_FUZZ_KERNEL_MUTATIONS", "80"))
SEEDS_PER_BINDING = 2  # distinct argument shapes recorded per binding
# process settings and queries: nothing a caller's arrays reach
NOT_KERNELS = {"get_num_threads", "set_num_threads", "int8_level",
               "Int8Kernel"}  # pack_int8's result type, built and checked by pack_int8 only
ALLOWED = (ValueError, TypeError, IndexError, RuntimeError)


# ----------------------------------------------------------------------------- the corpus
def _signature(value):
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _signature(v)) for k, v in value.items()))
    return type(value).__name__


def _picklable(value):
    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


class _Recorder:
    """Wraps every public function of `_core` (and `attnx.kernels`' names for them) to keep the first
    calls of each, by argument signature."""

    def __init__(self):
        self.corpus = {}
        self.originals = {}
        self.patched_classes = []

    def __enter__(self):
        for name in dir(_core):
            fn = getattr(_core, name)
            if name.startswith("_") or not callable(fn) or name in NOT_KERNELS:
                continue
            self.originals[name] = fn
            wrapper = self._wrap(name, fn)
            setattr(_core, name, wrapper)
            if getattr(kernels, name, None) is fn:
                setattr(kernels, name, wrapper)
            for cls, attr in self._held_by_classes(fn):  # a kernel a class keeps as a staticmethod
                self.patched_classes.append((cls, attr, cls.__dict__[attr]))
                setattr(cls, attr, staticmethod(wrapper))
        return self

    @staticmethod
    def _held_by_classes(fn):
        from attnx.layers.base import Layer
        todo, seen = [Layer], set()
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            todo += cls.__subclasses__()
            for attr, value in vars(cls).items():
                if isinstance(value, staticmethod) and value.__func__ is fn:
                    yield cls, attr

    def _wrap(self, name, fn):
        def wrapper(*args, **kwargs):
            seeds = self.corpus.setdefault(name, {})
            key = _signature((args, kwargs))
            if len(seeds) < SEEDS_PER_BINDING and key not in seeds and _picklable((args, kwargs)):
                # a snapshot before the call: a Python step's state (search_python_step) advances in it
                seeds[key] = pickle.loads(pickle.dumps((args, kwargs)))
            return fn(*args, **kwargs)
        return wrapper

    def __exit__(self, *exc):
        for name, fn in self.originals.items():
            setattr(_core, name, fn)
            if hasattr(kernels, name):
                setattr(kernels, name, fn)
        for cls, attr, original in self.patched_classes:
            setattr(cls, attr, original)


class _PythonStep:
    """A decoder without `compiled_step`: its model's Python step, which the one C++ search calls back."""

    def __init__(self, model):
        self.model = model

    def step(self, ids, position, state, return_attention=False):
        return self.model.step(ids, position, state, return_attention)


def _workload():
    """Runs every kernel at least once: the layer-contract cases forward and backward, the models of
    the loader fuzzer (translators, captioner, DRAW, HAN, LSTMN) trained a step and decoding, the losses
    and optimizers, a regularizer, int8 and bfloat16."""
    rng = np.random.default_rng(0)
    for name, (make, spec) in sorted(test_layer_contract.CASES.items()):
        spec = spec(rng, 2, 4)
        tensors, outputs = test_layer_contract._symbolic_call(make(), spec)
        model = attnx.Model(tensors, outputs)
        feed = [a for a, _ in spec]
        outs, cache = model.apply(feed, training=name not in test_layer_contract.TRAINING_EXEMPT)
        if cache is not None:
            model.backprop(cache, [np.ones_like(o) for o in test_layer_contract._list(outs)])
    for name, make in test_fuzz_loaders.MODELS.items():
        model, x = make()
        test_fuzz_loaders._probe(model, x)
        if name == "Transformer":
            model.beam_search(np.array([[5, 6, 7]]), width=2, max_length=3)
            # the same search over the model's Python step (what a decoder without a compiled step
            # gets): search_python_step calling back the cached step, decoder_stack_step
            decoding.beam_search(_PythonStep(model), model._start(np.array([[5, 6, 7]])), 1, model.start_id,
                                 model.end_id, 2, 0.0, 3)
            continue
        if name in ("Seq2Seq", "ImageCaptioner"):
            target = np.array([[1, 3, 4, 2], [1, 5, 2, 0]])
            model.fit(x, target, epochs=1, batch_size=2, verbose=0)
            continue
        if name == "DRAW":
            model.fit(x, epochs=1, batch_size=2, verbose=0)
            model.generate(1, steps=2)
            continue
        y = model.predict(x, verbose=0)
        model.fit(x, np.zeros_like(y), epochs=1, batch_size=2, verbose=0)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    for loss, y in (("binary_crossentropy", (rng.random((8, 1)) > 0.5).astype(np.float32)),
                    ("mse", rng.standard_normal((8, 1)).astype(np.float32)),
                    ("sparse_categorical_crossentropy", rng.integers(0, 3, 8)),
                    ("categorical_crossentropy", np.eye(3, dtype=np.float32)[rng.integers(0, 3, 8)])):
        units = 3 if "categorical" in loss else 1
        for optimizer in (attnx.optimizers.SGD(0.1, momentum=0.9), attnx.optimizers.Adam(clipnorm=1.0),
                          attnx.optimizers.RMSprop(clipvalue=0.5)):
            model = attnx.Sequential([layers.Dense(4, input_shape=(5,), kernel_regularizer=attnx.regularizers.L1L2(
                1e-3, 1e-3)), layers.Dense(units, activation="softmax" if units > 1 else "sigmoid")])
            model.compile(optimizer, loss)
            model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    # fit takes a regularizer's penalty and gradient in one pass; each alone, as a user's code calls them
    regularizer, w = attnx.regularizers.L1L2(1e-3, 1e-3), rng.standard_normal((5, 4)).astype(np.float32)
    regularizer(w), regularizer.gradient(w)
    ids = rng.integers(1, 12, (4, 5))
    model = attnx.Sequential([layers.Embedding(12, 8, input_shape=(5,)), layers.LSTM(6, return_sequences=True),
                              layers.GRU(4), layers.Dense(16), layers.Dense(2)])
    model.quantize("int8")
    model.predict(ids, verbose=0)  # the plan's int8 ops; the layers called alone reach the eager int8 bindings
    model.layers[1](model.layers[0](ids))
    encoder = layers.TransformerEncoder(1, 2, 16)  # int8 self-attention's q, k, v blocks and FeedForward in one call
    encoder(rng.standard_normal((2, 5, 8)).astype(np.float32))
    encoder.quantize("int8")
    encoder(rng.standard_normal((2, 5, 8)).astype(np.float32))
    attnx.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = attnx.Sequential([layers.Embedding(12, 8, input_shape=(5,)), layers.LSTM(6), layers.Dense(40)])
        model.compile("adam", "mse")
        model.fit(ids, rng.standard_normal((4, 40)).astype(np.float32), epochs=1, batch_size=4, verbose=0)
        encoder = layers.TransformerEncoder(1, 2, 16)  # self-attention's q, k, v of one input from one product
        x = rng.standard_normal((2, 5, 8)).astype(np.float32)
        encoder.backward(np.ones_like(encoder(x, training=True)))
    finally:
        attnx.mixed_precision.set_global_policy(None)
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    with attnx.GradientTape() as tape:
        tape.watch(a)
        loss = attnx.ops.sum(attnx.ops.softmax(a))
    tape.gradient(loss, a)
    # entry points the tests and the int8 error bound use, not the layers
    attnx.quantization.dense_error_bound(rng.standard_normal((3, 4)).astype(np.float32),
                                         rng.standard_normal((4, 5)).astype(np.float32))
    _core.round_to_bfloat16(x=a)
    _core.bf16_matmul(a=a[0], b=a[1], transpose_b=True)
    _core.int8_product(qx=rng.integers(-127, 128, (3, 4)).astype(np.int8),  # the int8 tiles (a test entry point)
                       qw=rng.integers(-127, 128, (4, 5)).astype(np.int8))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    attnx.set_random_seed(0)
    with _Recorder() as recorder:
        _workload()
    seeds = {name: list(calls.values()) for name, calls in recorder.corpus.items()}
    path = tmp_path_factory.mktemp("kernel_fuzz") / "corpus.pkl"
    path.write_bytes(pickle.dumps(seeds))
    return seeds, path


def test_the_corpus_reaches_every_binding(corpus):
    seeds, _ = corpus
    public = {n for n in dir(_core) if not n.startswith("_") and callable(getattr(_core, n))} - NOT_KERNELS
    assert not public - set(seeds), f"bindings no workload call reached: {sorted(public - set(seeds))}"


# ----------------------------------------------------------------------------- the mutations (in the child)
_FUZZ = r'''
import pickle, sys, zlib
import numpy as np
from attnx import _core

ALLOWED = (ValueError, TypeError, IndexError, RuntimeError)
corpus = pickle.load(open(sys.argv[1], "rb"))
per_seed = int(sys.argv[2])


def unaligned(v):
    raw = np.empty(v.nbytes + 1, np.uint8)[1:]
    out = raw.view(v.dtype).reshape(v.shape) if v.dtype.itemsize == 1 else np.frombuffer(raw.data, v.dtype).reshape(v.shape)
    out[...] = v
    return out


def array_mutations(v):
    out = {"object": lambda: v.astype(object), "bool": lambda: v != 0, "int32": lambda: v.astype(np.int32),
           "int64": lambda: v.astype(np.int64), "float16": lambda: v.astype(np.float16),
           "float64": lambda: v.astype(np.float64), "float32": lambda: v.astype(np.float32),
           "complex": lambda: v.astype(np.complex64), "add_axis": lambda: v[..., None], "none": lambda: None,
           "scalar": lambda: v.reshape(-1)[:1].reshape(()) if v.size else np.zeros((), v.dtype),
           "list": lambda: v.tolist(), "readonly": lambda: readonly(v)}
    if v.ndim:
        out["drop_axis"] = lambda: v[0] if v.shape[0] else np.zeros(v.shape[1:], v.dtype)
        for axis in range(v.ndim):
            out[f"axis{axis}+1"] = lambda a=axis: np.resize(v, v.shape[:a] + (v.shape[a] + 1,) + v.shape[a + 1:])
            out[f"axis{axis}-1"] = lambda a=axis: np.ascontiguousarray(np.take(v, range(max(v.shape[a] - 1, 0)), a))
            out[f"axis{axis}=0"] = lambda a=axis: np.zeros(v.shape[:a] + (0,) + v.shape[a + 1:], v.dtype)
        if v.size:
            out["strided"] = lambda: np.repeat(v, 2, axis=-1)[..., ::2]
            out["transposed"] = lambda: v.T if v.ndim > 1 else v[::-1]
            out["unaligned"] = lambda: unaligned(v)
    if v.size and v.dtype.kind == "f":
        for name, value in (("nan", np.nan), ("inf", np.inf), ("-inf", -np.inf), ("huge", 3e38), ("zero", 0.0)):
            out[name] = lambda value=value: np.full_like(v, value)
    if v.size and v.dtype.kind in "iu":
        for name, value in (("-1", -1), ("int_max", 2 ** 31 - 1), ("past_int", 2 ** 31), ("big", 10 ** 6)):
            out[name] = lambda value=value: np.full(v.shape, value, np.int64).astype(v.dtype, casting="unsafe")
    return out


def readonly(v):
    r = v.copy()
    r.flags.writeable = False
    return r


def scalar_mutations(v):
    common = {"none": None, "str": "attnx", "list": [v], "array": np.asarray([v])}
    if isinstance(v, bool):
        return {**common, "int2": 2}
    if isinstance(v, int):
        return {**common, "-1": -1, "0": 0, "int_max": 2 ** 31 - 1, "past_int": 2 ** 31, "past_int64": 2 ** 64,
                "float": 1.5, "true": True}
    if isinstance(v, float):
        return {**common, "nan": float("nan"), "inf": float("inf"), "-1": -1.0, "0": 0.0, "huge": 1e308,
                "int": 3}
    if isinstance(v, str):
        return {**common, "empty": "", "unknown": "no_such_option", "int": 1}
    if v is None:
        return {"array": np.zeros(1, np.float32), "str": "attnx", "int": 1}
    return common


def sequence_mutations(v):
    out = {"none": None, "empty": type(v)()}
    if len(v):
        out["drop_last"] = type(v)(v[:-1])
        out["repeat_last"] = type(v)(list(v) + [v[-1]])
        out["first_none"] = type(v)([None] + list(v[1:]))
    return {k: (lambda value=value: value) for k, value in out.items()}


def mutations_of(value):
    if isinstance(value, np.ndarray):
        return array_mutations(value)
    if isinstance(value, (list, tuple)):
        return sequence_mutations(value)
    if isinstance(value, dict):
        out = {"none": lambda: None}
        for key in value:
            out[f"drop {key}"] = lambda key=key: {k: v for k, v in value.items() if k != key}
        return out
    return {k: (lambda value=value: value) for k, value in scalar_mutations(value).items()}


def places(args, kwargs):
    """Every argument, and every array inside a list / dict argument: (label, getter, setter)."""
    found = []
    for i in range(len(args)):
        found.append((f"arg{i}", ("args", i, None)))
    for key, value in kwargs.items():
        found.append((key, ("kwargs", key, None)))
        if isinstance(value, (list, tuple, dict)):
            for inner in (range(len(value)) if not isinstance(value, dict) else value.keys()):
                if isinstance(value[inner], np.ndarray):
                    found.append((f"{key}[{inner!r}]", ("kwargs", key, inner)))
    return found


def get(args, kwargs, where):
    kind, key, inner = where
    value = (args if kind == "args" else kwargs)[key]
    return value if inner is None else value[inner]


def put(args, kwargs, where, new):
    kind, key, inner = where
    container = args if kind == "args" else kwargs
    if inner is None:
        container[key] = new
    else:
        outer = container[key]
        outer = dict(outer) if isinstance(outer, dict) else list(outer)
        outer[inner] = new
        container[key] = outer


def copied(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (list, tuple)):
        return type(value)(copied(v) for v in value)
    if isinstance(value, dict):
        return {k: copied(v) for k, v in value.items()}
    return value


bad, calls = [], 0
for name in sorted(corpus):
    fn = getattr(_core, name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    for seed_index, (args, kwargs) in enumerate(corpus[name]):
        spots = places(args, kwargs)
        if not spots:
            continue
        try:  # the seed itself runs here: otherwise every mutation would meet the same early error
            fn(*[copied(a) for a in args], **copied(kwargs))
        except BaseException as exc:
            bad.append(f"{name} seed {seed_index} as recorded: {type(exc).__name__}: {exc}"[:300])
            continue
        for _ in range(per_seed):
            label, where = spots[int(rng.integers(len(spots)))]
            options = mutations_of(get(args, kwargs, where))
            mutation = sorted(options)[int(rng.integers(len(options)))]
            call_args, call_kwargs = [copied(a) for a in args], copied(kwargs)
            try:
                new = options[mutation]()
            except Exception:
                continue  # the mutation itself does not apply to this value
            put(call_args, call_kwargs, where, new)
            print(f"{name} seed {seed_index}: {label} -> {mutation}", flush=True)
            calls += 1
            try:
                fn(*call_args, **call_kwargs)
            except ALLOWED:
                pass
            except BaseException as exc:
                bad.append(f"{name} seed {seed_index}: {label} -> {mutation}: {type(exc).__name__}: {exc}"[:300])
print("RESULT", calls, repr(bad), flush=True)
'''


def test_mutated_calls_raise_typed_errors_never_crash(corpus):
    _, path = corpus
    # the corpus pickles this module's _PythonStep by reference: the child imports it from this folder
    # (the sanitizer job runs pytest from the repository's root, where it is not on the path)
    path_entries = [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]
    done = subprocess.run([sys.executable, "-c", _FUZZ, str(path), str(MUTATIONS)], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONFAULTHANDLER": "1",
                                            "PYTHONPATH": os.pathsep.join(filter(None, path_entries))})
    lines = done.stdout.splitlines()
    last = lines[-1] if lines else "(no call)"
    assert done.returncode == 0, (f"the fuzzer's child ended with {done.returncode} at: {last}\n"
                                  f"{done.stderr[-3000:]}")
    assert last.startswith("RESULT"), last
    _, calls, bad = last.split(" ", 2)
    assert bad == "[]", f"untyped outcomes: {bad}"
    assert int(calls) >= 10 * len(corpus[0]), f"only {calls} mutated calls ran"


def test_decoder_backward_checks_the_gradient_table(corpus):
    """The fuzzer's find: grads["embeddings"] with fewer rows than params["embeddings"] was written past
    its end by the ids' rows (heap corruption, a crash at exit); now refused before the kernel runs."""
    seeds, _ = corpus
    args, kwargs = seeds["decoder_backward"][0]
    kwargs = dict(kwargs)
    grads = dict(kwargs["grads"])
    grads["embeddings"] = np.zeros((0,) + grads["embeddings"].shape[1:], grads["embeddings"].dtype)
    kwargs["grads"] = grads
    with pytest.raises(ValueError, match=r"decoder_backward: grads: embeddings"):
        _core.decoder_backward(*args, **kwargs)
