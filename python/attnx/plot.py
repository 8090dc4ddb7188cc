"""Plots: attention heatmaps with tokens on the axes, attention over an image, and training curves
(matplotlib)."""
import functools

import numpy as np


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("attnx.plot needs matplotlib: pip install 'attnx[plot]'") from exc
    return plt


# A font whose glyphs each stand for this many code points or more draws placeholders, not letters:
# matplotlib's Last Resort font maps all 1,114,112 code points to 371 glyphs (a box per Unicode block).
_PLACEHOLDER_CODE_POINTS_PER_GLYPH = 16


@functools.lru_cache(maxsize=None)
def _charmap(path):
    """The code points the font file at `path` has real glyphs for (empty if it cannot be read, or
    if it is a placeholder font such as Last Resort, whose boxes are glyphs but show no letter)."""
    from matplotlib import ft2font
    try:
        charmap = ft2font.FT2Font(path).get_charmap()
    except (OSError, RuntimeError, ValueError):
        return frozenset()
    if len(charmap) >= _PLACEHOLDER_CODE_POINTS_PER_GLYPH * max(1, len(set(charmap.values()))):
        return frozenset()
    return frozenset(charmap)


@functools.lru_cache(maxsize=None)
def _fonts_covering(missing):
    """Names of installed fonts that together have the code points in `missing` (a frozenset),
    the most covering first; as many as have any of them when none has all. The system's fonts that
    matplotlib's font cache does not list (installed after it was made) are added to it when they help."""
    from matplotlib import font_manager
    manager = font_manager.fontManager
    entries = [(entry.name, entry.fname) for entry in manager.ttflist]
    known = {fname for _, fname in entries}
    newer = [path for path in font_manager.findSystemFonts() if path not in known and missing & _charmap(path)]
    for path in newer:
        manager.addfont(path)
    entries += [(entry.name, entry.fname) for entry in manager.ttflist if entry.fname in newer]
    candidates = {}
    for name, fname in entries:  # name -> the code points of `missing` it has
        covered = missing & _charmap(fname)
        if covered and len(covered) > len(candidates.get(name, ())):
            candidates[name] = covered
    chosen, left = [], set(missing)
    for name, covered in sorted(candidates.items(), key=lambda item: (-len(item[1]), item[0])):
        if left & covered:
            chosen.append(name)
            left -= covered
    return tuple(chosen)


def font_family_for(texts):
    """A font family list for matplotlib text that shows every character of `texts`: the default
    family, followed by installed fonts with the glyphs it lacks (e.g. a Devanagari font for
    Marathi, found through matplotlib's font manager). None when the default font has them all,
    or no installed font has any of the missing ones (matplotlib then draws boxes and warns)."""
    from matplotlib import font_manager, rcParams
    chars = frozenset(ord(ch) for text in texts for ch in str(text) if not ch.isspace())
    missing = chars - _charmap(font_manager.findfont(font_manager.FontProperties()))
    if not missing:
        return None
    fallbacks = _fonts_covering(missing)
    return [*rcParams["font.family"], *fallbacks] if fallbacks else None


def attention_heatmap(weights, source_tokens=None, target_tokens=None, ax=None, cmap="viridis", title=None,
                      colorbar=True):
    """Draws attention weights (target steps x source positions) as a heatmap.

    Args:
        weights: (T_target, S_source) array, e.g. one example of what an attention layer returns
            with ``return_attention_scores=True``; a 1-D array (pooling weights) is drawn as one row.
        source_tokens: labels of the columns (len S).
        target_tokens: labels of the rows (len T).
        ax: a matplotlib Axes to draw on (default: a new figure).
    Labels in scripts the default font lacks (Devanagari, CJK, ...) are drawn with an installed
    font that has them (`font_family_for`), without changing matplotlib's settings.

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
    family = font_family_for([*(source_tokens or []), *(target_tokens or []), title or ""])
    font = {} if family is None else {"fontfamily": family}
    if source_tokens is not None:
        ax.set_xticks(range(w.shape[1]))
        ax.set_xticklabels(source_tokens, rotation=90, **font)
    if target_tokens is not None:
        ax.set_yticks(range(w.shape[0]))
        ax.set_yticklabels(target_tokens, **font)
    if title:
        ax.set_title(title, **font)
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    return ax


def _upsample_to(grid, height, width):
    """A (gh, gw) grid stretched over (height, width) pixels, each pixel taking the value of the cell
    its centre falls in (the cells tile the image as the plot draws them)."""
    gh, gw = grid.shape
    rows = np.minimum(((np.arange(height) + 0.5) * gh / height).astype(int), gh - 1)
    cols = np.minimum(((np.arange(width) + 0.5) * gw / width).astype(int), gw - 1)
    return grid[rows[:, None], cols[None, :]]


def attention_over_image(image, weights, words, grid_shape, axes=None, cmap="jet", alpha=0.5, ncols=None,
                         image_cmap="gray"):
    """The image once per word with that word's attention over it (Show, Attend and Tell's figure).

    Args:
        image: (H, W), (H, W, 1) or (H, W, 3) pixels.
        weights: (n_words, L) attention over the L regions for each word (e.g. from
            `attnx.vision.ImageCaptioner.caption`).
        words: the n_words captions words, one panel title each.
        grid_shape: (gh, gw) with gh * gw = L, the regions' grid (the encoder's last feature map),
            upsampled to the image so that each cell covers its share of the pixels.
        axes: n_words matplotlib Axes to draw on (default: a new figure).
        cmap, alpha: colour map and opacity of the attention layer.
        ncols: panels per row of a new figure (default all in one row).
        image_cmap: colour map of a one-channel image.

    Returns:
        The list of Axes, one per word.
    """
    img = np.asarray(image, dtype=np.float64)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[-1] not in (3, 4)) or 0 in img.shape:
        raise ValueError(f"attention_over_image: expected an image (H, W), (H, W, 1) or (H, W, 3), got "
                         f"{np.shape(image)}")
    w = np.asarray(weights, dtype=np.float64)
    words = list(words)
    try:
        gh, gw = (int(v) for v in grid_shape)
    except (TypeError, ValueError):
        raise TypeError(f"attention_over_image: `grid_shape` must be (rows, columns), got {grid_shape!r}") from None
    if w.ndim == 1:
        w = w[None, :]
    if w.ndim != 2 or len(words) != w.shape[0]:
        raise ValueError(f"attention_over_image: expected weights (n_words, L) for {len(words)} words, got "
                         f"{np.shape(weights)}")
    if gh < 1 or gw < 1 or gh * gw != w.shape[1]:
        raise ValueError(f"attention_over_image: grid_shape {(gh, gw)} does not hold the {w.shape[1]} regions")
    plt = _pyplot()
    n = len(words)
    if axes is None:
        ncols = n if ncols is None else max(1, min(int(ncols), n))
        nrows = -(-n // ncols)
        height, width = img.shape[:2]
        panel = 2.2
        _, grid = plt.subplots(nrows, ncols, squeeze=False,
                               figsize=(panel * ncols * max(1.0, width / height), panel * nrows + 0.3))
        axes = list(grid.ravel())
        for ax in axes[n:]:
            ax.axis("off")
    axes = list(np.ravel(np.asarray(axes, dtype=object)))[:n]
    if len(axes) < n:
        raise ValueError(f"attention_over_image: {len(axes)} axes for {n} words")
    family = font_family_for(words)
    font = {} if family is None else {"fontfamily": family}
    height, width = img.shape[:2]
    for ax, word, row in zip(axes, words, w):
        ax.imshow(img, cmap=image_cmap if img.ndim == 2 else None)
        ax.imshow(_upsample_to(row.reshape(gh, gw), height, width), cmap=cmap, alpha=alpha,
                  vmin=0.0, vmax=max(1e-12, float(row.max())))
        ax.set_title(word, **font)
        ax.set_xticks([])
        ax.set_yticks([])
    return axes


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
