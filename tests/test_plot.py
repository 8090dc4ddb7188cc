"""attention_heatmap draws labels in any script with an installed font that has its glyphs,
without rcParams set by the user, and still draws when no font has them."""
import warnings

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402

from attnx import plot  # noqa: E402

MARATHI = ["<start>", "मी", "घरी", "जात", "आहे", ".", "<end>"]
ENGLISH = ["i", "am", "going", "home", "."]
DEVANAGARI_MA = ord("म")


def has_devanagari_font():
    return any(DEVANAGARI_MA in plot._charmap(f.fname) for f in font_manager.fontManager.ttflist)


def draw_and_collect_glyph_warnings(**kwargs):
    weights = np.random.default_rng(0).dirichlet(np.ones(len(ENGLISH)), size=len(MARATHI))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ax = plot.attention_heatmap(weights, source_tokens=ENGLISH, target_tokens=MARATHI, **kwargs)
        ax.figure.canvas.draw()
    plt.close(ax.figure)
    return ax, [str(w.message) for w in caught if "missing from" in str(w.message)]


@pytest.mark.skipif(not has_devanagari_font(), reason="no Devanagari font installed (e.g. fonts-lohit-deva)")
def test_marathi_heatmap_has_no_missing_glyph_warning():
    default_family = list(matplotlib.rcParams["font.family"])
    ax, missing = draw_and_collect_glyph_warnings(title="मी घरी जात आहे")
    assert missing == []
    assert matplotlib.rcParams["font.family"] == default_family  # nothing changed for other plots
    family = ax.get_yticklabels()[1].get_fontfamily()
    assert family[:len(default_family)] == default_family and len(family) > len(default_family)
    assert ax.get_xticklabels()[0].get_fontfamily() == family


def test_latin_labels_keep_the_default_font():
    assert plot.font_family_for(ENGLISH + ["<start>"]) is None


def test_without_a_font_for_the_script_it_still_draws(monkeypatch):
    monkeypatch.setattr(plot, "_fonts_covering", lambda missing: ())
    ax, missing = draw_and_collect_glyph_warnings()
    assert [t.get_text() for t in ax.get_yticklabels()] == MARATHI
    assert missing  # boxes, and matplotlib says so


def test_attention_over_image_one_panel_per_word_with_the_grid_stretched_over_the_image():
    image = np.random.default_rng(1).random((16, 48, 1))
    weights = np.zeros((3, 2 * 10))
    weights[[0, 1, 2], [1, 14, 8]] = 1.0  # regions (0, 1), (1, 4), (0, 8) of a 2 x 10 grid
    axes = plot.attention_over_image(image, weights, ["seven", "two", "nine"], grid_shape=(2, 10))
    assert [ax.get_title() for ax in axes] == ["seven", "two", "nine"]
    overlay = axes[1].get_images()[1].get_array()
    assert overlay.shape == (16, 48)
    rows, cols = np.nonzero(overlay)
    # cell (1, 4) covers rows [8, 16) and columns [19.2, 24)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (8, 15, 19, 23)
    plt.close(axes[0].figure)
    fig, given = plt.subplots(1, 3)
    assert plot.attention_over_image(image[..., 0], weights, ["a", "b", "c"], (2, 10), axes=given)[2] is given[2]
    plt.close(fig)
    with pytest.raises(ValueError, match="grid_shape"):
        plot.attention_over_image(image, weights, ["a", "b", "c"], grid_shape=(3, 10))
    with pytest.raises(ValueError, match="3 words"):
        plot.attention_over_image(image, weights[:2], ["a", "b", "c"], grid_shape=(2, 10))
    with pytest.raises(ValueError, match="image"):
        plot.attention_over_image(np.zeros((4, 4, 2)), weights, ["a", "b", "c"], grid_shape=(2, 10))
