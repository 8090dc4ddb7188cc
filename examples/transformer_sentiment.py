"""A transformer sentiment classifier on the UCI review sentences (amazon + yelp): token embedding
+ sinusoidal positions + 2 encoder layers + masked average pooling.

    python examples/transformer_sentiment.py [--seeds 0 1 2 3 4] [--epochs 8]

Reads the data from ATTNX_DATA_DIR (or a data_dir / download cache, see
attnx.datasets.load_uci_sentiment) and prints the validation accuracy of each seed and their mean.
"""
import argparse

import numpy as np

import attnx
from attnx import layers

MAX_LEN = 32


def build_model(num_words, dim=32, heads=2, num_layers=2):
    return attnx.Sequential([
        attnx.Input((MAX_LEN,), dtype="int64"),
        layers.Embedding(num_words, dim, mask_zero=True),  # the padding mask flows to the encoder and pooling
        layers.PositionalEncoding(),
        layers.TransformerEncoder(num_layers, heads, intermediate_dim=2 * dim, dropout=0.1),
        layers.GlobalAveragePooling1D(),
        layers.Dropout(0.3),
        layers.Dense(1, activation="sigmoid"),
    ])


def load(seed, num_words):
    """Shuffled sentences as padded id sequences; the vocabulary comes from the training 80% only."""
    sentences, labels = attnx.datasets.load_uci_sentiment(sources=("amazon", "yelp"))
    order = np.random.default_rng(seed).permutation(len(sentences))
    sentences = [sentences[i] for i in order]
    labels = labels[order].astype(np.float32)
    cut = int(0.8 * len(sentences))
    tokenizer = attnx.text.Tokenizer(num_words=num_words)
    tokenizer.fit_on_texts(sentences[:cut])
    ids = attnx.text.pad_sequences(tokenizer.texts_to_sequences(sentences), maxlen=MAX_LEN, padding="post",
                                   truncating="post").astype(np.int64)
    return ids, labels


def train(seed, epochs=8, num_words=3000, verbose=0):
    """Trains one model; returns its validation accuracy after the last epoch."""
    attnx.set_random_seed(seed)
    x, y = load(seed, num_words)
    model = build_model(num_words)
    model.compile(optimizer=attnx.optimizers.Adam(1e-3), loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, epochs=epochs, batch_size=32, validation_split=0.2, verbose=verbose)
    return history.history["val_accuracy"][-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--verbose", type=int, default=0)
    args = parser.parse_args()
    accuracies = []
    for seed in args.seeds:
        accuracies.append(train(seed, args.epochs, verbose=args.verbose))
        print(f"seed {seed}: validation accuracy {accuracies[-1]:.4f}", flush=True)
    print(f"mean validation accuracy over {len(accuracies)} seeds: {np.mean(accuracies):.4f}")


if __name__ == "__main__":
    main()
