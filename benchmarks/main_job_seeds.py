"""Validation accuracy of the main job's sentiment model over seeds (examples/sentiment.py's protocol):
one home for accuracy-over-seeds, per variant, with the paired differences against `float32`.

    python benchmarks/main_job_seeds.py                         # seeds 0-19, the four variants, 1 thread
    python benchmarks/main_job_seeds.py --study                 # also the masked-vs-unmasked study

Variants (the same data order, tokenizer and seed in each; accuracy = predict > 0.5 on the last 20%):
    float32         Embedding(mask_zero=True): the LSTM and the pooling skip the padding
    unmasked        the README's model: no mask, the LSTM runs over the trailing padding
    mixed_bfloat16  float32's model under the mixed_bfloat16 policy
    int8            float32's trained model, quantized (model.quantize("int8"))
The study (--study) asks why the unmasked model scores higher:
    unmasked_pre    no mask, padding before the sentence (no state after the sentence's last word)
    masked_bidi     masked, Bidirectional(LSTM(50)) (every real step's state sees the whole sentence)
    masked_pool_all masked LSTM (a padding step repeats the last real state, Keras' default), pooling
                    over every step (AttentionPooling(use_mask=False)): the sentence's final state
                    reachable by the pooling, without the LSTM steps over the padding
and, for `unmasked`, the share of the pooling's attention that lands on padding steps.

Measured (seeds 0-19, 1 thread, a shared host; accuracy %, mean / std, paired difference to float32):
    float32 77.79 / 1.52; unmasked 79.51 / 1.59 (+1.73 +- 1.81); mixed_bfloat16 77.56 / 1.84 (-0.22 +- 0.86);
    int8 77.80 / 1.53 (+0.01 +- 0.06); unmasked_pre 75.28 / 2.37 (-2.51 +- 2.01); masked_bidi 82.12 / 2.15
    (+4.34 +- 2.43); masked_pool_all 80.61 / 1.92 (+2.83 +- 1.29). unmasked: 75.7% of the pooling's
    weight on padding steps (67.0% of those rows' steps).
Why the masked model scores lower (not a bug: the mask does what it says): a forward LSTM's state at a
real step has read only the words up to it, so the masked pooling averages prefix summaries, and the
one state that read the whole sentence is one step among the real ones. Unmasked and post-padded, the
LSTM's states over the trailing padding each carry the whole sentence, and the pooling puts 76% of its
weight there. Give the masked model that state (masked_pool_all: the padded steps repeat the last real
state and the pooling may attend them) and it gains 2.8 points, more than unmasking; make every real
step see the whole sentence (masked_bidi) and it gains 4.3; take the trailing states away from the
unmasked model (unmasked_pre) and it loses 2.5.
"""
import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a shared host: one core, before NumPy loads BLAS

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import sentiment  # noqa: E402

import attnx  # noqa: E402
from attnx import layers  # noqa: E402

VARIANTS = ("float32", "unmasked", "mixed_bfloat16", "int8")
STUDY = ("unmasked_pre", "masked_bidi", "masked_pool_all")


def sequences(seed, padding):
    sentences, labels = sentiment.load(seed)
    tokenizer = attnx.text.Tokenizer()
    tokenizer.fit_on_texts(sentences)
    x = attnx.text.pad_sequences(tokenizer.texts_to_sequences(sentences), maxlen=sentiment.MAXLEN,
                                 padding=padding, truncating="post")
    return x, labels, len(tokenizer.word_index) + 1


def study_model(variant, vocab_size):
    recurrent = (layers.Bidirectional(layers.LSTM(50, dropout=0.2, return_sequences=True))
                 if variant == "masked_bidi" else layers.LSTM(100, dropout=0.2, return_sequences=True))
    return attnx.Sequential([
        layers.Embedding(vocab_size, 32, input_shape=(sentiment.MAXLEN,), mask_zero=True,
                         embeddings_regularizer=attnx.regularizers.L2(1e-3)),
        recurrent,
        layers.AttentionPooling(use_mask=variant != "masked_pool_all"),
        layers.Dense(1, activation="sigmoid"),
    ])


def train(seed, variant):
    """The trained model of one variant and its validation split."""
    padding = "pre" if variant == "unmasked_pre" else "post"
    x, y, vocab_size = sequences(seed, padding)
    attnx.set_random_seed(seed)
    attnx.mixed_precision.set_global_policy("mixed_bfloat16" if variant == "mixed_bfloat16" else None)
    try:
        if variant in ("masked_bidi", "masked_pool_all"):
            model = study_model(variant, vocab_size)
        else:
            model = sentiment.lstm_attention_model(vocab_size, mask_zero=variant in ("float32", "mixed_bfloat16"))
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
        model.fit(x, y, epochs=10, batch_size=32, validation_split=0.2, verbose=0)
    finally:
        attnx.mixed_precision.set_global_policy(None)
    cut = int(len(x) * 0.8)  # fit's validation_split=0.2: the last 20%
    return model, x[cut:], y[cut:]


def accuracy(model, x, y):
    return float(np.mean((model.predict(x, verbose=0)[:, 0] > 0.5) == (y > 0.5)))


def padding_attention(model, x):
    """Mean share of the pooling's weights on padding steps (id 0), over rows with padding."""
    embedding, lstm, pooling = model.layers[:3]
    states = lstm(embedding(x))
    _, weights = pooling(states, return_attention_scores=True)
    padded = x == 0
    rows = padded.any(axis=1)
    return float(np.mean(np.sum(weights * padded, axis=1)[rows])), float(np.mean(padded[rows]))


def summary(name, values):
    v = 100 * np.asarray(values)
    return (f"{name:16s} mean {v.mean():6.2f}  std {v.std(ddof=1) if len(v) > 1 else 0.0:5.2f}  "
            f"min {v.min():6.2f}  max {v.max():6.2f}  (n={len(v)})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--study", action="store_true", help="also the masked-vs-unmasked study variants")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS + STUDY, help="only these (float32 first)")
    args = parser.parse_args()
    attnx.set_num_threads(args.threads)
    variants = VARIANTS + (STUDY if args.study else ())
    if args.variants:
        variants = ("float32",) + tuple(v for v in args.variants if v != "float32")
    results = {v: [] for v in variants}
    shares = []
    start = time.perf_counter()
    for seed in range(args.seed, args.seed + args.seeds):
        for variant in variants:
            if variant == "int8":
                continue  # float32's model, quantized below
            model, x_val, y_val = train(seed, variant)
            results[variant].append(accuracy(model, x_val, y_val))
            if variant == "float32" and "int8" in variants:
                model.quantize("int8")
                results["int8"].append(accuracy(model, x_val, y_val))
            if variant == "unmasked":
                shares.append(padding_attention(model, x_val))
        print(f"seed {seed}: " + "  ".join(f"{v} {100 * results[v][-1]:.2f}" for v in variants)
              + f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    print("\nvalidation accuracy (%) over seeds "
          f"{args.seed}-{args.seed + args.seeds - 1}:")
    for v in variants:
        print(summary(v, results[v]))
    print("\npaired differences against float32 (points, same seed):")
    for v in variants[1:]:
        print(summary(f"{v} - float32", np.subtract(results[v], results["float32"])))
    if shares:
        on_padding, padded = np.mean(shares, axis=0)
        print(f"\nunmasked: {100 * on_padding:.1f}% of the pooling's attention on padding steps "
              f"({100 * padded:.1f}% of the steps of those rows are padding)")


if __name__ == "__main__":
    main()
