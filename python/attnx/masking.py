"""The one mask rule: every layer that takes a mask or lengths turns it into what the kernels read
with `as_mask`, so every layer accepts the same things and words its errors the same way.

The rule (Keras' convention, True = real token / may attend):
- a mask is a bool array, or an integer array holding only 0 and 1;
- its shape is (batch, steps) (one flag per position: padding, an RNN's steps) or, where the
  layer attends per query, (batch, queries, steps); where the layer allows a mask shared by the
  batch, the batch axis may be 1;
- lengths are a 1-D integer array (batch,) with values in [0, steps]: the first ``lengths[b]``
  positions of row b are real;
- a fully masked row (length 0) is allowed everywhere: it gives zero attention weights, a zero
  context, a zero pooled vector, an RNN state that stays the initial state; never NaN.
Anything else raises TypeError (dtype) or ValueError (shape, values) naming the layer and the
argument, what was expected and what came.
"""
import numpy as np


def as_mask(mask, batch, steps, where, queries=None, shared=False):
    """`mask` (a mask or lengths, or None) as a C-contiguous bool array (B, S) or (B, Tq, S), or None.

    Args:
        batch, steps: B and S, the batch size and the number of positions masked.
        where: who is asking, e.g. "Layer 'lstm': `mask`" (starts every error message).
        queries: Tq when a per-query mask (B, Tq, S) is allowed.
        shared: also accept a batch axis of 1 (one mask for every row); returned as given.
    """
    if mask is None:
        return None
    m = np.asarray(mask)
    _check_dtype(m, where, " or integer lengths")
    if m.ndim == 1 and m.dtype.kind in "iu":
        if m.shape != (batch,):
            raise ValueError(f"{where}: expected lengths of shape ({batch},), got shape {m.shape}")
        if m.size and (m.min() < 0 or m.max() > steps):
            raise ValueError(f"{where}: expected lengths in [0, {steps}], got {m.min()}..{m.max()}")
        return np.ascontiguousarray(np.arange(steps)[None, :] < m[:, None])
    rows = (batch, 1) if shared and batch != 1 else (batch,)
    shapes = [(b, steps) for b in rows] + ([(b, queries, steps) for b in rows] if queries is not None else [])
    if m.shape not in shapes:
        raise ValueError(f"{where}: expected a mask of shape {' or '.join(map(str, shapes))} or lengths "
                         f"({batch},), got shape {m.shape}")
    return np.ascontiguousarray(mask_values(m, where))


def mask_values(mask, where):
    """The value rule of every mask, `as_mask`'s and the losses' (whose masks cover any leading axes of the
    values): bool, or integers holding only 0 and 1 (True / 1 = real); returned as bool."""
    m = np.asarray(mask)
    _check_dtype(m, where)
    if m.dtype != np.bool_:
        if m.size and (m.min() < 0 or m.max() > 1):
            raise ValueError(f"{where}: an integer mask must hold only 0 and 1, got values "
                             f"{m.min()}..{m.max()}")
        m = m != 0
    return m


def _check_dtype(m, where, or_lengths=""):
    if m.dtype.kind not in "biu":
        raise TypeError(f"{where}: expected a bool mask (True = real position){or_lengths}, got dtype "
                        f"{m.dtype}" + (" (additive float masks are not supported)" if m.dtype.kind == "f" else ""))


# ------------------------------------------------------------------ propagation
# Keras' mask propagation, written once: the functional graph (`models.graph`), the ONNX export
# (`export.model`), a layer called on arrays inside a `call` or GradientTape block (`layers.base`) and the
# Keras file reader (`interop.keras_file`) all ask these functions (tests/test_mask_propagation.py).
def call_mask(inputs, mask_of, given=None):
    """The mask a layer call receives: `given` (the mask passed to the call) wins; else the masks its
    inputs carry (``mask_of(input)``, None for an input without one) in the structure of `inputs` (a
    list for a list of inputs, one mask for one input), or None when no input carries one."""
    if given is not None:
        return given
    many = isinstance(inputs, (list, tuple))
    found = carried_masks(inputs if many else [inputs], mask_of)
    if all(m is None for m in found):
        return None
    return found if many else found[0]


def carried_masks(tensors, mask_of):
    """The mask each of `tensors` carries (``mask_of(tensor)``, None for none), as a list."""
    return [mask_of(t) for t in tensors]


def output_masks(outputs, masks):
    """(output, mask) for each output of a call, `masks` as `compute_mask` gives them (a list, one mask,
    or None); None for the outputs it gives none."""
    masks = masks if isinstance(masks, list) else [masks]
    return list(zip(outputs, masks + [None] * (len(outputs) - len(masks))))
