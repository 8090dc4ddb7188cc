"""Inference time of attnx's own predict against the same model exported with attnx.export and run in
ONNX Runtime (CPU), in one process with the same thread count; prints a Markdown table of medians.

    python benchmarks/onnx_inference.py              # 1 thread each
    python benchmarks/onnx_inference.py --threads 2

Weights are untrained (time does not depend on them); the Seq2Seq decodes max_length steps either way.
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import attnx
from attnx import export, layers
from attnx.seq2seq import Seq2Seq


def median_ms(fn, rounds):
    fn()  # warm up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def ids(rng, batch, steps, vocab):
    x = rng.integers(1, vocab, (batch, steps))
    for row, n in zip(x, rng.integers(steps // 2, steps + 1, batch)):
        row[n:] = 0
    return x


def sentiment_model():
    return attnx.Sequential([layers.Embedding(5000, 32, input_shape=(32,)), layers.LSTM(100, return_sequences=True),
                             layers.AttentionPooling(), layers.Dense(1, activation="sigmoid")])


def transformer_model():
    inputs = attnx.Input((None,), dtype="int64")
    x = layers.PositionalEncoding()(layers.Embedding(5000, 64, mask_zero=True)(inputs))
    x = layers.TransformerEncoder(2, num_heads=4, intermediate_dim=128)(x)
    return attnx.Model(inputs, layers.Dense(2, activation="softmax")(layers.GlobalAveragePooling1D()(x)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    attnx.set_num_threads(args.threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    rng = np.random.default_rng(0)
    folder = Path(tempfile.mkdtemp())
    rows = []
    for name, model, batches in (
            ("sentiment LSTM(100) + AttentionPooling, T=32", sentiment_model(),
             [ids(rng, 1, 32, 5000), ids(rng, 32, 32, 5000)]),
            ("2-layer transformer encoder classifier, D=64, T=64", transformer_model(),
             [ids(rng, 1, 64, 5000), ids(rng, 32, 64, 5000)])):
        path = export.to_onnx(model, folder / "model.onnx")
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feed = sess.get_inputs()[0].name
        for x in batches:
            ours = median_ms(lambda: model.predict(x, batch_size=len(x)), args.rounds)
            theirs = median_ms(lambda: sess.run(None, {feed: x}), args.rounds)
            rows.append((f"{name}, batch {len(x)}", ours, theirs))
    model = Seq2Seq(5000, 5000, embedding_dim=128, units=256, start_token=1, end_token=2, max_length=16)
    translator = export.OnnxSeq2Seq(export.to_onnx(model, folder / "seq2seq"), sess_options=options)
    for batch in (1, 32):
        source = ids(rng, batch, 16, 5000)
        ours = median_ms(lambda: model.greedy_decode(source), max(5, args.rounds // 3))
        theirs = median_ms(lambda: translator.greedy_decode(source), max(5, args.rounds // 3))
        rows.append((f"Seq2Seq GRU(256) + Bahdanau greedy decoding, 16 steps, batch {batch}", ours, theirs))
    print(f"| model, {args.threads} thread(s) | attnx predict | ONNX Runtime | ONNX Runtime / attnx |")
    print("|---|---|---|---|")
    for label, ours, theirs in rows:
        print(f"| {label} | {ours:.2f} ms | {theirs:.2f} ms | {theirs / ours:.2f}x |")


if __name__ == "__main__":
    main()
