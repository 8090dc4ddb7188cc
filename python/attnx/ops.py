"""Array operations with Keras 3's `keras.ops` names, and the reverse-mode autodiff that lets a layer
written with them train without a hand-written backward pass.

    from attnx import ops as K

    class Attention(attnx.layers.Layer):
        def build(self, input_shape):
            self.W = self.add_weight("att_weight", (input_shape[-1], 1), "random_normal")
            self.b = self.add_weight("att_bias", (input_shape[1], 1), "zeros")

        def call(self, x):
            et = K.squeeze(K.tanh(K.dot(x, self.W) + self.b), axis=-1)
            at = K.expand_dims(K.softmax(et), axis=-1)
            return K.sum(x * at, axis=1)

Outside training every op takes and returns plain NumPy arrays (with NumPy's broadcasting and
dtype rules), so `call` runs inference at NumPy speed. A training call of a layer that defines
`call` and no `forward` runs `call` under a `Tape` (`attnx.layers.base.Layer.forward`): the call's
inputs and the layer's weights are *watched* and become `TracedArray` leaves (a weight is found by
the identity of the array `add_weight` returned, so `K.dot(x, self.W)` needs nothing special); every
op on a traced value records itself and returns a `TracedArray`, which also has the arithmetic
operators (``+ - * / ** @``, unary ``-``, ``abs``), indexing ``x[:, -1]``, ``.shape``, ``.ndim``,
``.dtype`` and ``.T``. The tape is that call's cache; `Layer.backprop` replays it in reverse.

One caveat: an expression of weights and constants alone that does not go through an op, such as
``self.W * 2`` or ``self.W.T``, is NumPy's and is not traced; write ``K.multiply(self.W, 2)`` or
``K.transpose(self.W)`` (or let a traced value take part: ``x * self.W`` is traced).

Gradients: each op's rule is in `_GRADIENTS` (the equation above it); the tape sums the gradients
of a value used several times and sums a gradient over the axes an input was broadcast along
(`_unbroadcast`). Integer and boolean values are never traced and get no gradient. Heavy ops run
on BLAS (`matmul`, `dot` and two-operand `einsum` become one batched matrix product) or on attnx's
C++ kernels (`scaled_dot_product_attention`, `attention_pooling`).
"""
import builtins
import contextlib
import contextvars
import string
import threading

import numpy as np

from . import kernels
from .masking import as_mask

__all__ = ["Tape", "GradientTape", "TracedArray", "add", "subtract", "multiply", "divide", "power", "negative", "abs", "absolute",
           "square", "sqrt", "exp", "log", "tanh", "sigmoid", "relu", "softmax", "matmul", "dot", "einsum", "sum",
           "mean", "max", "maximum", "minimum", "clip", "where", "expand_dims", "squeeze", "reshape", "transpose",
           "concatenate", "stack", "scaled_dot_product_attention", "attention_pooling", "active_tape", "untraced"]


# ============================================================================ the tape
class TracedArray:
    """A value computed on a `Tape`: an array whose ops are recorded for the backward pass.

    `value` is the NumPy array. NumPy functions are not traced and refuse a TracedArray (use the
    ops of this module); ``ndarray <op> TracedArray`` defers to the TracedArray.
    """

    __slots__ = ("value", "tape", "index")
    __array_ufunc__ = None  # `ndarray + traced` calls traced.__radd__ instead of NumPy's add

    def __init__(self, value, tape, index):
        self.value, self.tape, self.index = value, tape, index

    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)
    dtype = property(lambda self: self.value.dtype)
    size = property(lambda self: self.value.size)
    T = property(lambda self: transpose(self))

    def __len__(self):
        return len(self.value)

    def __array__(self, dtype=None, copy=None):
        raise TypeError("a TracedArray (a value inside a training call) cannot become a NumPy array: NumPy "
                        "functions would drop its gradient; use the functions of attnx.ops")

    def __repr__(self):
        return f"TracedArray({self.value!r})"

    def __float__(self):
        return float(self.value)

    def numpy(self):
        """The array (TensorFlow's name)."""
        return self.value

    def __getitem__(self, key):
        return _apply("getitem", _getitem, self, key=key)

    def __add__(self, other): return add(self, other)
    def __radd__(self, other): return add(other, self)
    def __sub__(self, other): return subtract(self, other)
    def __rsub__(self, other): return subtract(other, self)
    def __mul__(self, other): return multiply(self, other)
    def __rmul__(self, other): return multiply(other, self)
    def __truediv__(self, other): return divide(self, other)
    def __rtruediv__(self, other): return divide(other, self)
    def __pow__(self, other): return power(self, other)
    def __rpow__(self, other): return power(other, self)
    def __matmul__(self, other): return matmul(self, other)
    def __rmatmul__(self, other): return matmul(other, self)
    def __neg__(self): return negative(self)
    def __abs__(self): return absolute(self)
    # comparisons give plain bool arrays (no gradient), e.g. for `where`
    def __lt__(self, other): return self.value < untraced(other)
    def __le__(self, other): return self.value <= untraced(other)
    def __gt__(self, other): return self.value > untraced(other)
    def __ge__(self, other): return self.value >= untraced(other)

    def sum(self, axis=None, keepdims=False): return sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return max(self, axis, keepdims)
    def reshape(self, *shape): return reshape(self, shape[0] if len(shape) == 1 else shape)


_active = threading.local()  # .tapes: this thread's stack of recording tapes
# The gradient buffers of the `GradientTape.gradient` replaying on this thread (a context variable, so
# that a layer's backward run side by side on a helper thread sees it too), or None.
_gradient_sink = contextvars.ContextVar("attnx_gradient_sink", default=None)


class _GradientSink:
    """One `GradientTape.gradient`'s gradient buffers, one per weight (by identity), zeros when first
    asked for: while it replays, layers add their weights' gradients here instead of into their shared
    ``grads`` buffers (see `gradient_buffers`), so that two threads taking gradients of one model do not
    add into each other's."""

    def __init__(self):
        self._buffers = {}  # id(weight) -> (weight, its gradient)

    def buffer(self, weight):
        entry = self._buffers.get(id(weight))
        if entry is None or entry[0] is not weight:
            entry = self._buffers[id(weight)] = (weight, np.zeros_like(weight))
        return entry[1]


def zero_gradients(buffers):
    """Sets gradient buffers to zero: each float dtype's contiguous ones in one kernel call split across
    the threads (ndarray.fill runs on one core: a seq2seq step's 64 MiB of buffers took 8 ms), any other
    with ``fill``."""
    by_dtype = {}
    for g in buffers:
        by_dtype.setdefault(g.dtype, []).append(g)
    for dtype, group in by_dtype.items():
        if dtype in (np.float32, np.float64) and all(g.flags.c_contiguous and g.flags.writeable for g in group):
            kernels.zero_(group)
        else:
            for g in group:
                g.fill(0)


def gradient_buffers(params, grads):
    """The buffers a backward pass adds the gradients of `params` ({name: weight}) into: `grads` (a
    layer's own ``grads``), or inside `GradientTape.gradient` that tape's buffers of the same weights."""
    sink = _gradient_sink.get()
    if sink is None:
        return grads
    return type(grads)((name, sink.buffer(p)) for name, p in params.items())


class Tape:
    """The record of the ops run while it is active (``with tape:``), replayed by `backward`.

    One training call of a layer owns one tape (its cache), so two calls keep two records.

        tape = Tape()
        with tape:
            x = tape.watch(x_array)                      # a leaf whose gradient is wanted
            w = tape.watch(weight, into=weight_grad)     # a leaf whose gradient is added into a buffer
            y = ops.tanh(ops.dot(x, weight))             # the raw `weight` array is found by identity
        dx, = tape.backward([y], [dy], sources=[x])      # also adds dL/dweight into weight_grad

    Besides the ops, a tape records whole calls with their own backward (`record_call`): a built-in
    layer called inside a recorded computation is one such node, its backward the layer's C++ one.
    """

    def __init__(self):
        # ops: (rule, out index, out, input indices (None: constant), input values, attrs); a recorded
        # call: (None, its outputs' indices, its outputs, input indices, backward, None)
        self._ops = []
        self._count = 0       # values on the tape (leaves and op outputs)
        self._watched = {}    # id(array) -> its leaf, for arrays given by identity (weights)
        self._buffers = []    # (leaf, gradient buffer) from watch(into=...)
        self._weights = {}    # id(param) -> (param, gradient buffer) of every layer whose call was recorded
        self.calls = {}       # deterministic layer calls recorded, for Layer._record_call to reuse

    def __enter__(self):
        tapes = _active.__dict__.setdefault("tapes", [])
        tapes.append(self)
        return self

    def __exit__(self, *exc):
        _active.tapes.pop()

    @property
    def recording(self):
        return any(t is self for t in getattr(_active, "tapes", []))

    def watch(self, array, into=None):
        """The leaf of `array` on this tape (the same leaf each time for the same array object).
        `into`: a buffer that `backward` adds the gradient of `array` into."""
        leaf = self._watched.get(id(array))
        if leaf is None or leaf.value is not array:
            leaf = TracedArray(array, self, self._new_index())
            self._watched[id(array)] = leaf
            if into is not None:
                self._buffers.append((leaf, into))
                self._weights[id(array)] = (array, into)
        return leaf

    def traced(self, x):
        """`x` as this tape sees it: a TracedArray of this tape, the leaf of a watched array, or `x`."""
        if isinstance(x, TracedArray):
            if x.tape is not self:
                raise ValueError("a TracedArray from another training call was used: keep values of one call "
                                 "inside that call")
            return x
        leaf = self._watched.get(id(x))
        return leaf if leaf is not None and leaf.value is x else x

    def _new_index(self):
        self._count += 1
        return self._count - 1

    def record(self, rule, out, inputs, values, attrs):
        index = self._new_index()
        ids = [x.index if isinstance(x, TracedArray) else None for x in inputs]
        self._ops.append((rule, index, out, ids, values, attrs))
        return TracedArray(out, self, index)

    def record_call(self, backward, outputs, inputs, weights=()):
        """Records a call computed outside the ops: `outputs` (arrays) from `inputs` (values as the
        tape sees them), ``backward(output grads) -> input grads`` (None entries for outputs without a
        gradient; None for inputs without one) adding its weights' gradients into their buffers;
        `weights`: the (param, buffer) pairs it adds into. Returns the outputs, float ones traced."""
        for param, buffer in weights:
            self._weights[id(param)] = (param, buffer)
        traced = [TracedArray(o, self, self._new_index()) if _is_float_array(o) else o for o in outputs]
        ids = [x.index if isinstance(x, TracedArray) else None for x in inputs]
        indices = [t.index if isinstance(t, TracedArray) else None for t in traced]
        self._ops.append((None, indices, outputs, ids, backward, None))
        return traced

    def backward(self, outputs, output_grads, sources=()):
        """Replays the tape from `outputs` (their gradients `output_grads`; None or an untraced
        output contributes nothing). Adds the gradient of every weight (watched with `into`, or of a
        recorded call) into its buffer and returns the gradients of `sources` (zeros for a source the
        outputs do not use)."""
        grads = self._replay(outputs, output_grads)
        return [grads[s.index] if s.index in grads else np.zeros_like(s.value) for s in sources]

    def _replay(self, outputs, output_grads):
        grads = {}
        for out, g in zip(outputs, output_grads):
            if isinstance(out, TracedArray) and g is not None:
                g = np.asarray(g)
                if g.shape != out.shape:
                    raise ValueError(f"the gradient of an output of shape {out.shape} has shape {g.shape}")
                _accumulate(grads, out.index, _unbroadcast(g, out.value))
        for rule, index, out, ids, values, attrs in reversed(self._ops):
            if rule is None:  # a recorded call: `values` is its backward
                gs = [None if i is None else grads.pop(i, None) for i in index]
                if all(g is None for g in gs):
                    continue
                dxs = values(gs)
                values = [None] * len(ids)
            else:
                g = grads.pop(index, None)
                if g is None:
                    continue
                dxs = _GRADIENTS[rule](g, out, *values, **attrs)
            for i, x, dx in zip(ids, values, dxs):
                if i is not None and dx is not None:
                    _accumulate(grads, i, dx if x is None else _unbroadcast(dx, x))
        sink = _gradient_sink.get()
        for leaf, buffer in self._buffers:
            if leaf.index in grads:
                (buffer if sink is None else sink.buffer(leaf.value))[...] += grads[leaf.index]
        return grads


class GradientTape(Tape):
    """TensorFlow's GradientTape: records what runs inside ``with`` and gives gradients.

        with attnx.GradientTape() as tape:
            predictions = model(x)                       # layers and `attnx.ops` record on the tape
            loss = loss_fn(y, predictions)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    The weights of every layer called inside are watched; ``tape.watch(x)`` watches an input array
    (ops then find it by identity). A tape gives gradients once unless ``persistent=True``. Tapes
    belong to the thread that opened them. The gradients live on the tape: `gradient` neither reads nor
    writes the layers' ``grads`` buffers, so threads taking gradients of one model at once get their own.
    """

    def __init__(self, persistent=False, watch_accessed_variables=True):
        super().__init__()
        self.persistent = bool(persistent)
        self._spent = False

    def watch(self, array, into=None):
        if isinstance(array, (list, tuple)):
            return type(array)(self.watch(a) for a in array)
        if isinstance(array, TracedArray):
            return array
        array = np.asarray(array) if not isinstance(array, np.ndarray) else array
        if array.dtype.kind != "f":
            raise TypeError(f"GradientTape.watch: only floating point arrays have gradients, got dtype {array.dtype}")
        return super().watch(array, into)

    def gradient(self, target, sources, output_gradients=None):
        """d target / d source for each of `sources` (an array or a list of arrays: weights or watched
        inputs), in their structure; None for a source `target` does not depend on (as TensorFlow).
        `target` is a value computed on this tape (a list of them: the gradient of their sum)."""
        if self._spent:
            raise RuntimeError("GradientTape.gradient can only be called once on a non-persistent tape: "
                               "use GradientTape(persistent=True) to compute several gradients")
        if self.recording:
            raise RuntimeError("GradientTape.gradient was called inside the tape's `with` block: call it after")
        targets = list(target) if isinstance(target, (list, tuple)) else [target]
        for t in targets:
            if not isinstance(t, TracedArray) or t.tape is not self:
                raise ValueError(f"GradientTape.gradient: the target ({_describe(t)}) was not computed on this tape "
                                 "from watched values or layer weights inside its `with` block")
        if output_gradients is None:
            output_gradients = [np.ones_like(t.value) for t in targets]
        else:
            output_gradients = list(output_gradients) if isinstance(output_gradients, (list, tuple)) else [
                output_gradients]
            if len(output_gradients) != len(targets):
                raise ValueError(f"GradientTape.gradient: {len(targets)} targets but {len(output_gradients)} "
                                 "output_gradients")
        if not self.persistent:
            self._spent = True
        sink = _GradientSink()
        token = _gradient_sink.set(sink)
        try:
            grads = self._replay(targets, output_gradients)
        finally:
            _gradient_sink.reset(token)

        def result(source):
            entry = self._weights.get(id(source))
            if entry is not None and entry[0] is source:
                return sink.buffer(source)
            leaf = source if isinstance(source, TracedArray) else self._watched.get(id(source))
            if leaf is None or leaf.tape is not self or (leaf.value is not source and leaf is not source):
                return None
            g = grads.get(leaf.index)
            return None if g is None else np.array(g, dtype=leaf.value.dtype)

        out = type(sources)(result(s) for s in sources) if isinstance(sources, (list, tuple)) else result(sources)
        if not self.persistent:
            self._ops, self._watched, self._weights = [], {}, {}  # free what the replay needed
        return out


def _describe(x):
    if isinstance(x, TracedArray):
        return "a value of another tape"
    return f"a {type(x).__name__}" + (f" of shape {np.shape(x)}" if isinstance(x, np.ndarray) else "")


def _is_float_array(x):
    return isinstance(x, np.ndarray) and x.dtype.kind == "f"


def _accumulate(grads, index, g):
    # never in place: a rule may hand the same array to two inputs (d(x + y) = (g, g))
    grads[index] = g if index not in grads else grads[index] + g


def _unbroadcast(g, x):
    """`g`, the gradient of a value broadcast from `x`, summed back to x's shape (and dtype):
    a broadcast copies x along an axis, so the gradient adds over that axis."""
    shape = np.shape(x)
    if g.shape != shape:
        g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
        axes = tuple(a for a, (n, m) in enumerate(zip(shape, g.shape)) if n == 1 and m != 1)
        g = g.sum(axis=axes, keepdims=True) if axes else g
        g = g.reshape(shape)
    dtype = getattr(x, "dtype", None)
    return g.astype(dtype, copy=False) if dtype is not None and dtype.kind == "f" else g


def active_tape():
    """The tape recording on this thread (inside a training call of a `call` layer), or None."""
    tapes = getattr(_active, "tapes", None)
    return tapes[-1] if tapes else None


@contextlib.contextmanager
def paused():
    """Within the block nothing is recorded (a recorded layer call computes its own outputs)."""
    tapes = _active.__dict__.setdefault("tapes", [])
    tapes.append(None)
    try:
        yield
    finally:
        tapes.pop()


def untraced(x):
    """The array behind `x` (x itself when it is not a TracedArray): what a training call returns."""
    return x.value if isinstance(x, TracedArray) else x


def _trace(args):
    """(active tape or None, `args` as the tape sees them, the arrays behind them)."""
    tape = active_tape()
    if tape is None:  # outside every tape a traced value is its array (e.g. a loss after the `with` block)
        values = [untraced(a) for a in args]
        return None, values, values
    inputs = [tape.traced(a) for a in args]
    return tape, inputs, [untraced(a) for a in inputs]


def _output(tape, rule, out, inputs, values, attrs):
    """`out`, recorded on `tape` as made by `rule` when one of `inputs` is traced."""
    if tape is None or not any(isinstance(a, TracedArray) for a in inputs):
        return out
    return tape.record(rule, out, inputs, values, attrs)


def _apply(rule, forward, *args, **attrs):
    """``forward(*values, **attrs)`` on the arrays behind `args`, recorded as `rule` when a tape is
    active and an argument is traced (a traced value or a watched array)."""
    tape, inputs, values = _trace(args)
    return _output(tape, rule, forward(*values, **attrs), inputs, values, attrs)


# ============================================================================ the ops
def add(x1, x2):
    """``x1 + x2`` with broadcasting."""
    return _apply("add", np.add, x1, x2)


def subtract(x1, x2):
    """``x1 - x2`` with broadcasting."""
    return _apply("subtract", np.subtract, x1, x2)


def multiply(x1, x2):
    """``x1 * x2`` with broadcasting."""
    return _apply("multiply", np.multiply, x1, x2)


def divide(x1, x2):
    """``x1 / x2`` with broadcasting."""
    return _apply("divide", np.true_divide, x1, x2)


def power(x1, x2):
    """``x1 ** x2`` with broadcasting."""
    return _apply("power", np.power, x1, x2)


def negative(x):
    return _apply("negative", np.negative, x)


def absolute(x):
    return _apply("absolute", np.absolute, x)


abs = absolute  # noqa: A001  (Keras' name)


def square(x):
    return _apply("square", np.square, x)


def sqrt(x):
    return _apply("sqrt", np.sqrt, x)


def exp(x):
    return _apply("exp", np.exp, x)


def log(x):
    """Natural logarithm."""
    return _apply("log", np.log, x)


def tanh(x):
    return _apply("tanh", np.tanh, x)


def _sigmoid(x):
    # 1 / (1 + e^-x) without overflow for large |x|: e^-|x| <= 1
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z))


def sigmoid(x):
    return _apply("sigmoid", _sigmoid, x)


def relu(x):
    """``max(x, 0)``."""
    return _apply("relu", lambda v: np.maximum(v, 0), x)


def _softmax(x, axis, mask):
    if mask is None:
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)
    keep = np.broadcast_to(mask, x.shape)
    top = np.max(np.where(keep, x, -np.inf), axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)  # a fully masked row has no maximum
    e = np.exp(np.where(keep, x - top, -np.inf))
    total = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(total > 0, total, 1)  # a fully masked row: all weights 0


def softmax(x, axis=-1, mask=None):
    """Softmax over `axis`. `mask` (bool, broadcast to x; True = keep) gives masked entries weight
    0, and a fully masked row all zeros (never NaN)."""
    return _apply("softmax", _softmax, x, axis=axis, mask=None if mask is None else np.asarray(mask, bool))


def matmul(x1, x2):
    """Matrix product with NumPy's rules: batch axes broadcast, 1-D operands are vectors."""
    return _apply("matmul", np.matmul, x1, x2)


def dot(x1, x2):
    """NumPy's (and Keras') dot: for N-D `x1` and 2-D `x2` the product over the last axis of x1,
    ``(..., C) . (C, D) -> (..., D)``; in general the sum over the last axis of x1 and the
    second-to-last of x2 (the last if x2 is 1-D); a scalar operand multiplies."""
    n1, n2 = np.ndim(untraced(x1)), np.ndim(untraced(x2))
    if n1 == 0 or n2 == 0:
        return multiply(x1, x2)
    letters = iter(string.ascii_letters)
    a = "".join(next(letters) for _ in range(n1 - 1))
    b = "".join(next(letters) for _ in range(builtins.max(n2 - 2, 0)))
    contracted, last = next(letters), ("" if n2 == 1 else next(letters))
    return einsum(f"{a}{contracted},{b}{contracted}{last}->{a}{b}{last}", x1, x2)


def _einsum_parts(subscripts, shapes):
    """(input subscripts, output subscript, whether an axis of size 1 broadcasts) of an explicit or
    implicit einsum without ellipsis, checked against the operands' `shapes` as NumPy checks them:
    letters only, each output letter once and from an input, a letter's sizes equal or 1."""
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts must be a string such as 'ij,jk->ik', got {type(subscripts).__name__}")
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise ValueError(f"einsum: '...' is not supported ({subscripts!r}); name every axis")
    inputs, arrow, out = spec.partition("->")
    inputs = inputs.split(",")
    bad = next((c for c in "".join(inputs) + out if not c.isascii() or not c.isalpha()), None)
    if bad is not None:
        raise ValueError(f"einsum: invalid subscript {bad!r} in {subscripts!r}; subscripts must be letters")
    if len(inputs) != len(shapes) or any(len(s) != len(n) for s, n in zip(inputs, shapes)):
        raise ValueError(f"einsum: subscripts {subscripts!r} do not match operands of ranks "
                         f"{[len(n) for n in shapes]}")
    if arrow:
        for c in out:
            if out.count(c) > 1 or not any(c in s for s in inputs):
                raise ValueError(f"einsum: output subscript {c!r} of {subscripts!r} " +
                                 ("appears more than once" if out.count(c) > 1 else "appears in no input"))
    else:  # implicit output: the letters that appear once, in alphabetical order
        joined = "".join(inputs)
        out = "".join(sorted(c for c in set(joined) if joined.count(c) == 1))
    sizes, broadcast = {}, False
    for k, (letters, shape) in enumerate(zip(inputs, shapes)):
        for c, n in zip(letters, shape):
            seen, where = sizes.setdefault(c, (n, k))
            if n != seen:
                if 1 not in (n, seen):
                    raise ValueError(f"einsum: {subscripts!r}: axis {c!r} has size {seen} in operand {where} and "
                                     f"{n} in operand {k} (operand shapes {[tuple(s) for s in shapes]})")
                broadcast = True
                if seen == 1:
                    sizes[c] = (n, k)
    return inputs, out, broadcast


def _einsum2(a, b, sa, sb, out):
    """The two-operand einsum as one batched matrix product (BLAS): the letters of both operands and
    the output are batch axes, of both but not the output contracted, of one and the output free."""
    def summed_away(x, letters, other):
        """x with the axes of letters in neither the other operand nor the output summed."""
        kept = "".join(c for c in letters if c in other or c in out)
        return (x, letters) if kept == letters else (np.einsum(f"{letters}->{kept}", x), kept)

    (a, sa), (b, sb) = summed_away(a, sa, sb), summed_away(b, sb, sa)
    batch = [c for c in out if c in sa and c in sb]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]
    contracted = [c for c in sa if c in sb and c not in out]
    size = dict(zip(sa, a.shape)) | dict(zip(sb, b.shape))

    def product(letters):
        return int(np.prod([size[c] for c in letters], dtype=np.int64))

    a3 = np.transpose(a, [sa.index(c) for c in batch + left + contracted]).reshape(
        [size[c] for c in batch] + [product(left), product(contracted)])
    b3 = np.transpose(b, [sb.index(c) for c in batch + contracted + right]).reshape(
        [size[c] for c in batch] + [product(contracted), product(right)])
    result = np.matmul(a3, b3).reshape([size[c] for c in batch + left + right])
    order = batch + left + right
    return np.transpose(result, [order.index(c) for c in out])


def _einsum(*operands, subscripts):
    inputs, out, broadcast = _einsum_parts(subscripts, [np.shape(x) for x in operands])
    if len(operands) == 2 and not broadcast and all(len(set(s)) == len(s) for s in inputs):
        return _einsum2(*operands, *inputs, out)
    return np.einsum(f"{','.join(inputs)}->{out}", *operands, optimize=True)


def einsum(subscripts, *operands):
    """Einstein summation, e.g. ``einsum("bqd,bkd->bqk", q, k)``. Two operands run as one batched
    BLAS product; more as NumPy's optimized einsum. Gradients need subscripts without '...' and
    without a letter repeated within one operand."""
    return _apply("einsum", _einsum, *operands, subscripts=subscripts)


def _reduce(numpy_reduction):
    return lambda x, axis, keepdims: numpy_reduction(x, axis=axis, keepdims=keepdims)


def sum(x, axis=None, keepdims=False):  # noqa: A001  (Keras' name)
    """Sum over `axis` (int, tuple or None for all)."""
    return _apply("sum", _reduce(np.sum), x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return _apply("mean", _reduce(np.mean), x, axis=axis, keepdims=keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001  (Keras' name)
    """Maximum over `axis`; its gradient is shared equally by tied maxima."""
    return _apply("max", _reduce(np.max), x, axis=axis, keepdims=keepdims)


def maximum(x1, x2):
    """Elementwise maximum with broadcasting (ties: the gradient goes to x1)."""
    return _apply("maximum", np.maximum, x1, x2)


def minimum(x1, x2):
    """Elementwise minimum with broadcasting (ties: the gradient goes to x1)."""
    return _apply("minimum", np.minimum, x1, x2)


def clip(x, x_min, x_max):
    """`x` limited to [x_min, x_max] (constants); no gradient where it is clipped."""
    return _apply("clip", np.clip, x, x_min, x_max)


def where(condition, x1, x2):
    """`x1` where `condition` (bool, not differentiated) holds, else `x2`, with broadcasting."""
    return _apply("where", np.where, np.asarray(untraced(condition), dtype=bool), x1, x2)


def expand_dims(x, axis):
    return _apply("reshape", np.expand_dims, x, axis=axis)


def squeeze(x, axis=None):
    return _apply("reshape", np.squeeze, x, axis=axis)


def reshape(x, newshape):
    return _apply("reshape", np.reshape, x, shape=newshape)


def transpose(x, axes=None):
    """Permutes the axes (reverses them when `axes` is None)."""
    return _apply("transpose", np.transpose, x, axes=axes)


def _concatenate(*xs, axis):
    return np.concatenate(xs, axis=axis)


def concatenate(xs, axis=0):
    """Joins the arrays of the list `xs` along an existing axis."""
    return _apply("concatenate", _concatenate, *xs, axis=axis)


def _stack(*xs, axis):
    return np.stack(xs, axis=axis)


def stack(x, axis=0):
    """Joins the arrays of the list `x` along a new axis."""
    return _apply("stack", _stack, *x, axis=axis)


def _getitem(x, key):
    return x[key]


def _kernel_inputs(op, **args):
    """`_trace` for a C++ kernel: the arrays as C-contiguous float32, or float64 when the first is.
    Real numbers only (a complex array would lose its imaginary part): else TypeError naming `op`
    and the argument."""
    tape, inputs, values = _trace(list(args.values()))
    arrays = [np.asarray(v) for v in values]
    for name, a in zip(args, arrays):
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{op}: `{name}` must hold real numbers, got dtype {a.dtype}")
    dtype = np.float64 if arrays[0].dtype == np.float64 else np.float32
    return tape, inputs, [np.ascontiguousarray(a, dtype=dtype) for a in arrays]


def scaled_dot_product_attention(query, key, value, mask=None, causal=False, scale=None, heads=1):
    """``softmax(scale * Q K^T) V`` per head, on attnx's C++ attention kernel.

    query (B, Tq, H * Dk), key (B, S, H * Dk), value (B, S, H * Dv) -> context (B, Tq, H * Dv).
    mask: (B, S) or (B, Tq, S) bool (True = may attend) or lengths (B,) (the `attnx.masking` rule);
    causal: query t sees keys s <= t; scale: 1 / sqrt(Dk) by default; heads: H.
    """
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads < 1:
        raise ValueError(f"scaled_dot_product_attention: `heads` must be a positive integer, got {heads!r}")
    tape, inputs, (q, k, v) = _kernel_inputs("scaled_dot_product_attention", query=query, key=key, value=value)
    scale = 1.0 / np.sqrt(builtins.max(1, q.shape[-1] // int(heads))) if scale is None else float(scale)
    if q.ndim == 3 and k.ndim == 3:
        mask = as_mask(mask, q.shape[0], k.shape[1], "scaled_dot_product_attention: `mask`", queries=q.shape[1],
                       shared=True)
    context, weights = kernels.sdpa_forward(query=q, key=k, value=v, mask=mask, causal=bool(causal), scale=scale,
                                          heads=int(heads), return_weights=tape is not None)
    return _output(tape, "scaled_dot_product_attention", context, inputs, [q, k, v],
                   {"weights": weights, "scale": scale, "heads": int(heads)})


def attention_pooling(x, kernel, bias, mask=None):
    """The sentiment tutorial's attention pooling on attnx's C++ kernel:
    ``e_t = tanh(x_t . kernel + bias_t)``, ``a = softmax(e)`` over time, ``sum_t a_t x_t``.

    x (B, T, d), kernel (d, 1), bias (T, 1) or (1, 1); mask (B, T) or lengths (B,) -> (B, d).
    """
    tape, inputs, (xv, kv, bv) = _kernel_inputs("attention_pooling", x=x, kernel=kernel, bias=bias)
    B, T, _ = xv.shape
    out, weights, energy = kernels.attention_pooling_forward(
        x=xv, kernel=kv, bias=bv, mask=as_mask(mask, B, T, "attention_pooling: `mask`"), return_sequences=False)
    return _output(tape, "attention_pooling", out, inputs, [xv, kv, bv], {"weights": weights, "energy": energy})


# ============================================================================ gradient rules
# Each rule maps (g = dL/d out, out, *input values, **attrs) to dL/d input for every input, None
# where an input has none; the tape then sums each over the axes the input was broadcast along.
def _matmul_grad(g, out, x1, x2):
    # out = x1 @ x2:   dx1 = g @ x2^T,   dx2 = x1^T @ g   (1-D operands as a row / a column)
    a = x1[None, :] if x1.ndim == 1 else x1
    b = x2[:, None] if x2.ndim == 1 else x2
    g = g[..., None] if x2.ndim == 1 else g
    g = g[..., None, :] if x1.ndim == 1 else g
    da = np.matmul(g, np.swapaxes(b, -1, -2))
    db = np.matmul(np.swapaxes(a, -1, -2), g)
    return (da[..., 0, :] if x1.ndim == 1 else da), (db[..., 0] if x2.ndim == 1 else db)


def _einsum_grad(g, out, *operands, subscripts):
    # out = einsum(s_1, ..., s_n -> o):   d operand_k = einsum(o, s_j (j != k) -> s_k)(g, operands_j),
    # then broadcast along the letters of s_k that appear nowhere else (they were summed away) and
    # along its axes of size 1 that the other operands broadcast
    inputs, out_letters, _ = _einsum_parts(subscripts, [np.shape(x) for x in operands])
    if any(len(set(s)) != len(s) for s in inputs):
        raise ValueError(f"einsum: no gradient for a letter repeated in one operand ({subscripts!r})")
    grads = []
    for k, target in enumerate(inputs):
        others = [s for j, s in enumerate(inputs) if j != k]
        reachable = "".join(c for c in target if c in out_letters or any(c in s for s in others))
        d = _einsum(g, *[x for j, x in enumerate(operands) if j != k],
                    subscripts=f"{','.join([out_letters] + others)}->{reachable}")
        if reachable != target:
            d = np.expand_dims(d, tuple(i for i, c in enumerate(target) if c not in reachable))
        # an axis of size 1 that another operand broadcast: the tape sums the gradient back over it
        d = np.broadcast_to(d, np.broadcast_shapes(d.shape, operands[k].shape))
        grads.append(d)
    return grads


def _restore_axes(g, x, axis, keepdims):
    """g of a reduction over `axis` broadcast back to the shape of x."""
    if axis is not None and not keepdims:
        g = np.expand_dims(g, axis)
    elif axis is None and not keepdims:
        g = np.reshape(g, (1,) * np.ndim(x))
    return np.broadcast_to(g, np.shape(x))


def _max_grad(g, out, x, axis, keepdims):
    # out = max_i x_i:   dx_i = g / (number of maxima) where x_i is a maximum, else 0
    top = _restore_axes(out, x, axis, keepdims)
    winners = (x == top)
    return (_restore_axes(g, x, axis, keepdims) * winners / winners.sum(axis=axis, keepdims=True),)


def _split_grad(g, out, *xs, axis):
    # out = concatenate(x_1, ..., x_n):   dx_k = the slice of g where x_k was placed
    ends = np.cumsum([x.shape[axis] for x in xs])[:-1]
    return np.split(g, ends, axis=axis)


def _sdpa_grad(g, out, q, k, v, weights, scale, heads):
    # out = softmax(scale q k^T) v: the C++ backward (dq, dk, dv)
    return kernels.sdpa_backward(dcontext=np.ascontiguousarray(g, dtype=q.dtype), weights=weights, query=q, key=k,
                               value=v, scale=scale, heads=heads)


def _pooling_grad(g, out, x, kernel, bias, weights, energy):
    # out = sum_t softmax(tanh(x kernel + bias))_t x_t: the C++ backward (dx, and adds into dkernel, dbias)
    dkernel, dbias = np.zeros_like(kernel), np.zeros_like(bias)
    dx = kernels.attention_pooling_backward(dout=np.ascontiguousarray(g, dtype=x.dtype), dweights=None,
                                          weights=weights, energy=energy, x=x, kernel=kernel, dkernel=dkernel,
                                          dbias=dbias, return_sequences=False)
    return dx, dkernel, dbias


def _power_grad(g, out, x1, x2):
    # out = x1^x2:   dx1 = g x2 x1^(x2 - 1),   dx2 = g out ln(x1)  (0 where x1 <= 0, as TF and PyTorch)
    with np.errstate(divide="ignore", invalid="ignore"):
        dx2 = np.where(np.asarray(x1) > 0, g * out * np.log(np.where(np.asarray(x1) > 0, x1, 1)), 0)
        return g * x2 * np.power(x1, np.subtract(x2, 1)), dx2


_GRADIENTS = {
    # out = x1 + x2:  dx1 = g,  dx2 = g
    "add": lambda g, out, x1, x2: (g, g),
    # out = x1 - x2:  dx1 = g,  dx2 = -g
    "subtract": lambda g, out, x1, x2: (g, -g),
    # out = x1 x2:  dx1 = g x2,  dx2 = g x1
    "multiply": lambda g, out, x1, x2: (g * x2, g * x1),
    # out = x1 / x2:  dx1 = g / x2,  dx2 = -g x1 / x2^2 = -g out / x2
    "divide": lambda g, out, x1, x2: (g / x2, -g * out / x2),
    "power": _power_grad,
    # out = -x:  dx = -g
    "negative": lambda g, out, x: (-g,),
    # out = |x|:  dx = g sign(x)
    "absolute": lambda g, out, x: (g * np.sign(x),),
    # out = x^2:  dx = 2 x g
    "square": lambda g, out, x: (2 * x * g,),
    # out = sqrt(x):  dx = g / (2 out)
    "sqrt": lambda g, out, x: (g / (2 * out),),
    # out = e^x:  dx = g out
    "exp": lambda g, out, x: (g * out,),
    # out = ln x:  dx = g / x
    "log": lambda g, out, x: (g / x,),
    # out = tanh x:  dx = g (1 - out^2)
    "tanh": lambda g, out, x: (g * (1 - out * out),),
    # out = sigmoid x:  dx = g out (1 - out)
    "sigmoid": lambda g, out, x: (g * out * (1 - out),),
    # out = max(x, 0):  dx = g [x > 0]
    "relu": lambda g, out, x: (g * (x > 0),),
    # out = softmax(x):  dx = out (g - sum_axis(g out))   (masked entries have out = 0, so dx = 0)
    "softmax": lambda g, out, x, axis, mask: (out * (g - np.sum(g * out, axis=axis, keepdims=True)),),
    "matmul": _matmul_grad,
    "einsum": _einsum_grad,
    # out = sum_axis x:  dx = g, copied along the summed axes
    "sum": lambda g, out, x, axis, keepdims: (_restore_axes(g, x, axis, keepdims),),
    # out = mean_axis x:  dx = g / n, copied along the n averaged entries
    "mean": lambda g, out, x, axis, keepdims: (_restore_axes(g, x, axis, keepdims) * (out.size / np.size(x)),),
    "max": _max_grad,
    # out = max(x1, x2):  dx1 = g [x1 >= x2],  dx2 = g [x1 < x2]
    "maximum": lambda g, out, x1, x2: (g * (x1 >= x2), g * (x1 < x2)),
    # out = min(x1, x2):  dx1 = g [x1 <= x2],  dx2 = g [x1 > x2]
    "minimum": lambda g, out, x1, x2: (g * (x1 <= x2), g * (x1 > x2)),
    # out = clip(x, lo, hi):  dx = g [lo <= x <= hi]
    "clip": lambda g, out, x, lo, hi: (g * ((x >= lo) & (x <= hi)), None, None),
    # out = cond ? x1 : x2:  dx1 = g [cond],  dx2 = g [not cond]
    "where": lambda g, out, cond, x1, x2: (None, g * cond, g * ~cond),
    # expand_dims, squeeze, reshape move no values:  dx = g in the shape of x
    "reshape": lambda g, out, x, **shape_args: (np.reshape(g, np.shape(x)),),
    # out = transpose(x, axes):  dx = transpose(g, inverse of axes)
    "transpose": lambda g, out, x, axes: (
        np.transpose(g, None if axes is None else np.argsort(np.asarray(axes) % np.ndim(x))),),
    "concatenate": _split_grad,
    # out = stack(x_1, ..., x_n):  dx_k = g[..., k, ...] along the new axis
    "stack": lambda g, out, *xs, axis: tuple(np.moveaxis(g, axis, 0)),
    # out = x[key]:  dx = zeros like x with g added at key (repeated indices add)
    "getitem": lambda g, out, x, key: (_scatter_add(x, key, g),),
    "scaled_dot_product_attention": _sdpa_grad,
    "attention_pooling": _pooling_grad,
}


def _scatter_add(x, key, g):
    dx = np.zeros(np.shape(x), dtype=np.result_type(g))
    np.add.at(dx, key, g)
    return dx


# ============================================================ the ops a tutorial uses (Keras 3 names)
# Comparisons, logic, argmax / argmin and zeros / ones make integer or boolean values, which have no
# gradient; `cast` to a float dtype keeps the gradient (cast back to the input's dtype).
def zeros(shape, dtype="float32"):
    """An array of zeros of `shape` (an int or a tuple of ints) and `dtype`."""
    return np.zeros(shape, dtype=np.dtype(dtype))


def ones(shape, dtype="float32"):
    """An array of ones of `shape` (an int or a tuple of ints) and `dtype`."""
    return np.ones(shape, dtype=np.dtype(dtype))


def equal(x1, x2):
    """``x1 == x2`` elementwise with broadcasting, as bool (no gradient)."""
    return np.equal(untraced(x1), untraced(x2))


def not_equal(x1, x2):
    """``x1 != x2`` elementwise with broadcasting, as bool (no gradient); e.g. the mask ``not_equal(ids, 0)``."""
    return np.not_equal(untraced(x1), untraced(x2))


def logical_and(x1, x2):
    """Elementwise `and` of the truth values of `x1` and `x2` (bool, no gradient)."""
    return np.logical_and(untraced(x1), untraced(x2))


def logical_or(x1, x2):
    """Elementwise `or` of the truth values of `x1` and `x2` (bool, no gradient)."""
    return np.logical_or(untraced(x1), untraced(x2))


def logical_not(x):
    """Elementwise `not` of the truth values of `x` (bool, no gradient)."""
    return np.logical_not(untraced(x))


def argmax(x, axis=None, keepdims=False):
    """The index of the largest value along `axis` (the first on ties; None: of the flattened array), int64."""
    return np.argmax(untraced(x), axis=axis, keepdims=keepdims).astype(np.int64)


def argmin(x, axis=None, keepdims=False):
    """The index of the smallest value along `axis` (the first on ties; None: of the flattened array), int64."""
    return np.argmin(untraced(x), axis=axis, keepdims=keepdims).astype(np.int64)


def _cast(x, dtype):
    return np.asarray(x).astype(dtype)


def cast(x, dtype):
    """`x` converted to `dtype` (NumPy's conversion: floats to integers truncate toward zero). A float
    result of a traced float value keeps its gradient; any other result has none."""
    dtype = np.dtype(dtype)
    value = untraced(x)
    if dtype.kind != "f" or np.asarray(value).dtype.kind != "f":
        return _cast(value, dtype)
    return _apply("cast", _cast, x, dtype=dtype)


# out = cast(x):  dx = g in x's dtype
_GRADIENTS["cast"] = lambda g, out, x, dtype: (np.asarray(g).astype(np.asarray(x).dtype),)
__all__ += ["zeros", "ones", "equal", "not_equal", "logical_and", "logical_or", "logical_not", "argmax", "argmin",
            "cast"]
