"""What the translators share (`attnx.seq2seq`, `attnx.translation`, `attnx.vision`): argument and
target checks, the log-softmax of decoding and GNMT's length penalty."""
import numpy as np


def positive_int(owner, arg, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{owner}: `{arg}` must be a positive integer, got {value!r}")
    return int(value)


def log_softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def length_penalty(length, alpha):
    """GNMT's ((5 + length) / 6) ** alpha (1 for alpha = 0)."""
    return ((5.0 + length) / 6.0) ** alpha


def without_trailing_padding(ids):
    """ids without the columns at the end that are padding in every row (ids has a real token)."""
    return ids[:, :np.flatnonzero((ids != 0).any(axis=0))[-1] + 1]


def check_target_ids(target, owner, what, start_id, max_length):
    """Teacher-forcing targets (B, steps) as integer ids, each row the start token, 1 to `max_length`
    tokens, then padding; a ValueError naming `owner` and `what` otherwise."""
    ids = np.asarray(target)
    if ids.dtype.kind not in "iu" or ids.ndim != 2:
        raise ValueError(f"{owner}: `{what}` expected integer ids of shape (batch, steps), got {ids.dtype} {ids.shape}")
    lengths = (ids != 0).sum(axis=1) - 1  # tokens after the start token
    if ids.shape[1] < 2 or lengths.min() < 1:
        raise ValueError(f"{owner}: every {what} needs the start token and at least one more token")
    if lengths.max() > max_length:
        raise ValueError(f"{owner}: a {what} has {lengths.max()} tokens after the start token, longer than "
                         f"max_length={max_length}")
    if not (ids[:, 0] == start_id).all():
        raise ValueError(f"{owner}: {what}s must begin with the start token id {start_id}")
    return ids
