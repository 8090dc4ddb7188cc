"""Sentiment classification on the UCI review sentences (amazon + yelp), Keras-tutorial style.

    python examples/sentiment.py [--epochs 10] [--seed 0]

Reads the data from ATTNX_DATA_DIR (or a data_dir / download cache, see
attnx.datasets.load_uci_sentiment) and prints the final validation accuracy.
"""
import argparse

import numpy as np

import attnx
from attnx import layers


def build_bag_of_words(num_words):
    return attnx.Sequential([
        layers.Dense(16, activation="relu", input_shape=(num_words,)),
        layers.Dropout(0.5),
        layers.Dense(1, activation="sigmoid"),
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--verbose", type=int, default=2)
    args = parser.parse_args()

    attnx.set_random_seed(args.seed)
    sentences, labels = attnx.datasets.load_uci_sentiment(sources=("amazon", "yelp"), data_dir=args.data_dir)
    order = np.random.default_rng(args.seed).permutation(len(sentences))
    sentences = [sentences[i] for i in order]
    labels = labels[order].astype(np.float32)

    num_words = 5000
    tokenizer = attnx.text.Tokenizer(num_words=num_words)
    cut = int(0.8 * len(sentences))
    tokenizer.fit_on_texts(sentences[:cut])  # vocabulary from the training part only
    x = tokenizer.texts_to_matrix(sentences, mode="binary").astype(np.float32)

    model = build_bag_of_words(num_words)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x, labels, epochs=args.epochs, batch_size=32, validation_split=0.2, verbose=args.verbose)
    print(f"validation accuracy: {history.history['val_accuracy'][-1]:.4f}")


if __name__ == "__main__":
    main()
