"""Keras' small utilities: `to_categorical`."""
import numpy as np


def to_categorical(x, num_classes=None):
    """Integer class labels as one-hot float32 rows (Keras' `keras.utils.to_categorical`).

    Args:
        x: integer labels of any shape (a trailing axis of size 1 is dropped, as Keras does).
        num_classes: the number of classes (default: the largest label + 1).

    Returns:
        An array of shape ``x.shape + (num_classes,)``.
    """
    labels = np.asarray(x)
    if labels.dtype.kind == "f":
        if not np.all(labels == np.round(labels)):
            raise ValueError("to_categorical: labels must be integers, got non-integral floats")
        labels = labels.astype(np.int64)
    elif labels.dtype.kind not in "iub":
        raise TypeError(f"to_categorical: labels must be integers, got dtype {labels.dtype}")
    if labels.ndim > 1 and labels.shape[-1] == 1:
        labels = labels.reshape(labels.shape[:-1])
    if labels.size and labels.min() < 0:
        raise ValueError(f"to_categorical: labels must be >= 0, got {labels.min()}")
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if labels.size else 0
    num_classes = int(num_classes)
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"to_categorical: label {labels.max()} is out of range for num_classes={num_classes}")
    out = np.zeros(labels.shape + (num_classes,), dtype=np.float32)
    np.put_along_axis(out, labels[..., None].astype(np.int64), 1.0, axis=-1)
    return out
