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
