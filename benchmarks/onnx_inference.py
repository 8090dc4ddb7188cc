"""Inference time of attnx's own predict against the same model exported with attnx.export and run in
ONNX Runtime (CPU), in one process with the same thread count; prints a Markdown table of medians.

    python benchmarks/onnx_inference.py              # 1 thread each
    python benchmarks/onnx_inference.py --threads 2

The classifiers' predict runs their compiled inference plan (attnx.models.plan); the "eager" column is
the same predict with the plan switched off (layer by layer from Python), timed interleaved with the
others round by round. Weights are untrained: the classifiers' time does not depend on them; the Seq2Seq's
one-row greedy step does (its int8 screen of the output layer recomputes in float32 every word that can
win, and untrained logits lie close together, so more words are recomputed than a trained model needs);
it decodes max_length steps either way. A second table splits attnx's time per call: the C++ call (kernels and the
crossing into C++: the plan's run, the Seq2Seq's one call of encoder and search) and the Python around it.
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
from attnx.models import plan
from attnx.seq2seq import Seq2Seq


def median_ms(fn, rounds):
    return interleaved_ms([fn], rounds)[0]


def interleaved_ms(fns, rounds):
    """Median milliseconds of each of `fns`, timed in turn within every round (a shared host's slow
    moments fall on all of them alike)."""
    for fn in fns:
        fn()  # warm up
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, kept in zip(fns, times):
            start = time.perf_counter()
            fn()
            kept.append(time.perf_counter() - start)
    return [1000 * statistics.median(kept) for kept in times]


def without_plan(fn):
    """fn run with the compiled inference plan switched off: the eager path, layer by layer."""
    def run():
        planned, plan.run = plan.run, lambda model, x: None
        try:
            return fn()
        finally:
            plan.run = planned
    return run


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
    rows, splits = [], []
    for name, model, batches in (
            ("sentiment LSTM(100) + AttentionPooling, T=32", sentiment_model(),
             [ids(rng, 1, 32, 5000), ids(rng, 32, 32, 5000)]),
            ("2-layer transformer encoder classifier, D=64, T=64", transformer_model(),
             [ids(rng, 1, 64, 5000), ids(rng, 32, 64, 5000)])):
        path = export.to_onnx(model, folder / "model.onnx")
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feed = sess.get_inputs()[0].name
        for x in batches:
            def ours():
                return model.predict(x, batch_size=len(x))
            np.testing.assert_allclose(ours(), sess.run(None, {feed: x})[0], rtol=1e-4, atol=1e-5)
            planned, eager, theirs = interleaved_ms([ours, without_plan(ours), lambda: sess.run(None, {feed: x})],
                                                    args.rounds)
            rows.append((f"{name}, batch {len(x)}", planned, theirs, eager))
            entry = model._inference_plans[(x.shape, x.dtype.char)]
            cpp, whole = interleaved_ms([lambda: entry.plan.run(x=x, result=entry.slot, shape=entry.shape), ours],
                                        args.rounds)
            splits.append((f"{name}, batch {len(x)}", whole, cpp))
    model = Seq2Seq(5000, 5000, embedding_dim=128, units=256, start_token=1, end_token=2, max_length=16)
    translator = export.OnnxSeq2Seq(export.to_onnx(model, folder / "seq2seq"), sess_options=options)
    for batch in (1, 32):
        source = ids(rng, batch, 16, 5000)
        label = f"Seq2Seq GRU(256) + Bahdanau greedy decoding, 16 steps, batch {batch}"
        ours, theirs = interleaved_ms([lambda: model.greedy_decode(source), lambda: translator.greedy_decode(source)],
                                      max(5, args.rounds // 3))
        rows.append((label, ours, theirs, None))
        splits.append((label, *seq2seq_split_ms(model, source, max(5, args.rounds // 3),
                                                lambda: translator.greedy_decode(source))))
    print_tables(args.threads, rows, splits)


def seq2seq_split_ms(model, source, rounds, between):
    """Median milliseconds of greedy_decode and of its C++ calls (encoder and search in one call; a model
    whose encoder that call does not compute: the encoder's recurrence and the search),
    timed in the same calls, each after an untimed `between()` (ONNX Runtime's decoding, as in the ratio
    table: its weights then stand in the caches where attnx's stood, and a call that finds its own still
    there, back to back, measured 0.3 ms less at batch 1)."""
    cpp = {"seq2seq_greedy", "rnn_forward", "search_attention_decoder"}
    spent = []

    def timed(fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[-1][1] += time.perf_counter() - start
        return call
    originals = {name: getattr(attnx.kernels, name) for name in cpp}
    try:
        for name, fn in originals.items():
            setattr(attnx.kernels, name, timed(fn))
        for _ in range(rounds + 1):
            between()
            spent.append([time.perf_counter(), 0.0])
            model.greedy_decode(source)
            spent[-1][0] = time.perf_counter() - spent[-1][0]
    finally:
        for name, fn in originals.items():
            setattr(attnx.kernels, name, fn)
    return tuple(1000 * statistics.median(kept[i] for kept in spent[1:]) for i in (0, 1))


def print_tables(threads, rows, splits):
    print(f"| model, {threads} thread(s) | attnx predict | ONNX Runtime | ONNX Runtime / attnx "
          "| attnx eager (no plan) | eager / plan |")
    print("|---|---|---|---|---|---|")
    for label, ours, theirs, eager in rows:
        tail = "| - | - |" if eager is None else f"| {eager:.3f} ms | {eager / ours:.2f}x |"
        print(f"| {label} | {ours:.3f} ms | {theirs:.3f} ms | {theirs / ours:.2f}x {tail}")
    print(f"\n| attnx per call, {threads} thread(s) | whole call | C++ call (kernels + crossing) | Python |")
    print("|---|---|---|---|")
    for label, whole, cpp in splits:
        print(f"| {label} | {whole:.3f} ms | {cpp:.3f} ms | {whole - cpp:.3f} ms ({(whole - cpp) / whole:.0%}) |")


if __name__ == "__main__":
    main()
