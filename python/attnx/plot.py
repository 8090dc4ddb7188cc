"""Plots: attention heatmaps with tokens on the axes, and training curves (matplotlib)."""
import numpy as np


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("attnx.plot needs matplotlib: pip install 'attnx[plot]'") from exc
    return plt


def attention_heatmap(weights, source_tokens=None, target_tokens=None, ax=None, cmap="viridis", title=None,
                      colorbar=True):
    """Draws attention weights (target steps x source positions) as a heatmap.

    Args:
        weights: (T_target, S_source) array, e.g. one example of what an attention layer returns
            with ``return_attention_scores=True``; a 1-D array (pooling weights) is drawn as one row.
        source_tokens: labels of the columns (len S).
        target_tokens: labels of the rows (len T).
        ax: a matplotlib Axes to draw on (default: a new figure).
    Returns:
        The Axes.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 1:
        w = w[None, :]
    if w.ndim != 2:
        raise ValueError(f"attention_heatmap: expected weights of shape (T, S) or (S,), got {np.shape(weights)}")
    if source_tokens is not None and len(source_tokens) != w.shape[1]:
        raise ValueError(f"attention_heatmap: {len(source_tokens)} source tokens for {w.shape[1]} columns")
    if target_tokens is not None and len(target_tokens) != w.shape[0]:
        raise ValueError(f"attention_heatmap: {len(target_tokens)} target tokens for {w.shape[0]} rows")
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.5 * w.shape[1] + 2), max(2, 0.5 * w.shape[0] + 1.5)))
    image = ax.imshow(w, cmap=cmap, aspect="auto", vmin=0.0, vmax=max(1e-12, float(w.max())))
    if source_tokens is not None:
        ax.set_xticks(range(w.shape[1]))
        ax.set_xticklabels(source_tokens, rotation=90)
    if target_tokens is not None:
        ax.set_yticks(range(w.shape[0]))
        ax.set_yticklabels(target_tokens)
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    return ax


def plot_history(history, metrics=("loss",), ax=None):
    """Plots training (and validation, if present) curves from ``model.fit``'s History."""
    logs = getattr(history, "history", history)
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for name in metrics:
        if name not in logs:
            raise KeyError(f"plot_history: '{name}' not in history ({sorted(logs)})")
        ax.plot(range(1, len(logs[name]) + 1), logs[name], label=name)
        if f"val_{name}" in logs:
            ax.plot(range(1, len(logs[f"val_{name}"]) + 1), logs[f"val_{name}"], label=f"val_{name}")
    ax.set_xlabel("epoch")
    ax.legend()
    return ax
