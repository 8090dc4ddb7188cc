"""The README's main job, quicker: the tutorial's Embedding -> LSTM -> AttentionPooling -> Dense
sentiment model on the real UCI amazon+yelp sentences learns (the full 10-epoch, 5-seed run is
examples/sentiment.py --seeds 5)."""
import importlib.util
import pathlib

import numpy as np

EXAMPLE = pathlib.Path(__file__).parent.parent / "examples" / "sentiment.py"


def load_example():
    spec = importlib.util.spec_from_file_location("sentiment_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lstm_attention_sentiment_learns():
    sentiment = load_example()
    history = sentiment.run(seed=0, model_name="lstm_attention", epochs=4, verbose=0)
    val = history.history["val_accuracy"]
    assert history.history["accuracy"][-1] > 0.85  # it fits the training sentences
    assert max(val) >= 0.76, val  # and generalizes (chance is 0.5)
    assert np.isfinite(history.history["val_loss"]).all()


def test_bag_of_words_baseline_learns():
    sentiment = load_example()
    history = sentiment.run(seed=0, model_name="bow", epochs=5, verbose=0)
    assert history.history["val_accuracy"][-1] >= 0.78
