"""Sentiment classification on the UCI review sentences (amazon + yelp) with an LSTM and attention
pooling, as in the Keras attention tutorial; prints the final validation accuracy.

    python examples/sentiment.py                  # LSTM + AttentionPooling, 10 epochs, seed 0
    python examples/sentiment.py --seeds 5        # mean over seeds 0..4
    python examples/sentiment.py --model bow      # bag-of-words baseline

Protocol (the tutorial's): Tokenizer over all sentences, sequences post-padded/truncated to 32
tokens, Embedding(vocab, 32) with L2 1e-3, LSTM(100, dropout 0.2, return_sequences) ->
AttentionPooling -> Dense(1, sigmoid), Adam, binary cross-entropy, 10 epochs, batch 32, the last
20% held out for validation. Data from ATTNX_DATA_DIR (see attnx.datasets.load_uci_sentiment).
"""
import argparse
import time

import numpy as np

import attnx
from attnx import layers

MAXLEN = 32


def load(seed, data_dir=None):
    sentences, labels = attnx.datasets.load_uci_sentiment(sources=("amazon", "yelp"), data_dir=data_dir)
    order = np.random.default_rng(seed).permutation(len(sentences))
    return [sentences[i] for i in order], labels[order].astype(np.float32)


def lstm_attention_model(vocab_size, mask_zero=True):
    return attnx.Sequential([
        layers.Embedding(vocab_size, 32, input_shape=(MAXLEN,), mask_zero=mask_zero,
                         embeddings_regularizer=attnx.regularizers.L2(1e-3)),
        layers.LSTM(100, dropout=0.2, return_sequences=True),
        layers.AttentionPooling(),
        layers.Dense(1, activation="sigmoid"),
    ])


def bag_of_words_model(num_words):
    return attnx.Sequential([
        layers.Dense(16, activation="relu", input_shape=(num_words,)),
        layers.Dropout(0.5),
        layers.Dense(1, activation="sigmoid"),
    ])


def run(seed, model_name="lstm_attention", epochs=10, verbose=2, data_dir=None, limit=None):
    """Trains one model; returns its History."""
    attnx.set_random_seed(seed)
    sentences, labels = load(seed, data_dir)
    if limit:
        sentences, labels = sentences[:limit], labels[:limit]
    if model_name == "bow":
        tokenizer = attnx.text.Tokenizer(num_words=5000)
        tokenizer.fit_on_texts(sentences)
        x = tokenizer.texts_to_matrix(sentences, mode="binary").astype(np.float32)
        model = bag_of_words_model(5000)
    else:
        tokenizer = attnx.text.Tokenizer()
        tokenizer.fit_on_texts(sentences)
        x = attnx.text.pad_sequences(tokenizer.texts_to_sequences(sentences), maxlen=MAXLEN, padding="post",
                                     truncating="post")
        model = lstm_attention_model(len(tokenizer.word_index) + 1)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model.fit(x, labels, epochs=epochs, batch_size=32, validation_split=0.2, verbose=verbose)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["lstm_attention", "bow"], default="lstm_attention")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1, help="run seeds seed .. seed+N-1 and report the mean")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--verbose", type=int, default=2)
    args = parser.parse_args()

    accuracies = []
    for seed in range(args.seed, args.seed + args.seeds):
        start = time.perf_counter()
        history = run(seed, args.model, args.epochs, args.verbose, args.data_dir)
        accuracies.append(history.history["val_accuracy"][-1])
        print(f"seed {seed}: validation accuracy {accuracies[-1]:.4f} ({time.perf_counter() - start:.0f} s)",
              flush=True)
    if len(accuracies) > 1:
        print(f"mean validation accuracy over {len(accuracies)} seeds: {np.mean(accuracies):.4f} "
              f"(min {np.min(accuracies):.4f}, max {np.max(accuracies):.4f})")
    else:
        print(f"validation accuracy: {accuracies[0]:.4f}")


if __name__ == "__main__":
    main()
