"""Heatmap labels show letters, not placeholder boxes (issue 31): for Devanagari, Arabic, CJK and
Latin labels the pixels attention_heatmap draws differ from those of the placeholder glyphs of
matplotlib's Last Resort font, which covers every code point with a box per Unicode block (a box
is a real glyph, so matplotlib warns of nothing). The fonts come from scripts/setup.sh
(fonts-lohit-deva, fonts-wqy-microhei; DejaVu Sans has Arabic)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib import font_manager  # noqa: E402

from attnx import plot  # noqa: E402

LAST_RESORT = "Last Resort High-Efficiency"
LABELS = {"devanagari": "मी घरी", "arabic": "مرحبا بك", "cjk": "我回家", "latin": "home"}


def _label_pixels(word, family):
    """The pixels of the one column label `word` of a heatmap, drawn with `family` (None: attnx's choice)."""
    original = plot.font_family_for
    if family is not None:
        plot.font_family_for = lambda texts: family
    try:
        ax = plot.attention_heatmap(np.ones((1, 1)), source_tokens=[word], colorbar=False)
    finally:
        plot.font_family_for = original
    fig = ax.figure
    fig.canvas.draw()
    label = ax.get_xticklabels()[0]
    box = label.get_window_extent(fig.canvas.get_renderer())
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].mean(axis=-1)
    height = image.shape[0]
    crop = image[int(height - box.y1):int(height - box.y0) + 1, int(box.x0):int(box.x1) + 1]
    family_drawn = label.get_fontfamily()
    plt.close(fig)
    return crop, family_drawn


def test_the_last_resort_font_counts_as_covering_nothing():
    paths = [entry.fname for entry in font_manager.fontManager.ttflist if entry.name == LAST_RESORT]
    assert paths, "matplotlib ships the Last Resort font"
    assert all(plot._charmap(path) == frozenset() for path in paths)
    assert LAST_RESORT not in plot._fonts_covering(frozenset(map(ord, "मी")))


@pytest.mark.parametrize("script", sorted(LABELS))
def test_labels_are_drawn_with_letters_not_placeholder_boxes(script):
    word = LABELS[script]
    chosen = plot.font_family_for([word])
    assert chosen is None or LAST_RESORT not in chosen, chosen
    drawn, _ = _label_pixels(word, None)
    boxes, family = _label_pixels(word, [LAST_RESORT])
    assert family == [LAST_RESORT]
    assert (drawn < 128).any(), "the label is blank"
    if drawn.shape == boxes.shape:
        differing = np.mean(np.abs(drawn - boxes) > 64)
        assert differing > 0.05, f"{script}: the label's pixels are those of the placeholder glyphs"
    # every character has a real glyph in the fonts chosen (the default one or a fallback)
    fonts = [font_manager.findfont(font_manager.FontProperties(family=[f]))
             for f in (chosen or []) if f not in ("sans-serif", "serif", "monospace")]
    fonts.append(font_manager.findfont(font_manager.FontProperties()))
    covered = frozenset().union(*(plot._charmap(f) for f in fonts))
    missing = [ch for ch in word if not ch.isspace() and ord(ch) not in covered]
    assert not missing, f"no installed font has {missing} (run scripts/setup.sh)"
