"""check_numerics: finding the first value of a training step that is NaN or infinite."""
import numpy as np


class NonFiniteError(FloatingPointError):
    """Raised by ``fit(..., check_numerics=True)`` when a value becomes NaN or infinite."""


def _nonfinite_report(value):
    """None if `value` (an array, or None) is finite (or not floating point), else e.g. '2 NaN, 1 inf of 12'."""
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.dtype.kind not in "fc" or np.isfinite(arr).all():
        return None
    n_nan = int(np.isnan(arr).sum())
    return f"{n_nan} NaN, {int(arr.size - n_nan - np.isfinite(arr).sum())} inf of {arr.size} values"


def _check_finite(values, where):
    """Raises NonFiniteError naming `where` (a callable index -> text) for the first non-finite array."""
    for i, v in enumerate(values):
        report = _nonfinite_report(v)
        if report is not None:
            raise NonFiniteError(f"check_numerics: {where(i)} is not finite ({report})")
