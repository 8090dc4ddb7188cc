"""The Transformer's cached decoding in tokens per second: greedy and beam 4, batch 1 and 32, at 1
and 2 threads, for one or several checkouts of attnx run interleaved (before / after a change).

    python benchmarks/bench_decode_step.py                          # this checkout
    python benchmarks/bench_decode_step.py --trees before=/tmp/old/python after=python --repeats 2

Each (tree, threads) runs in its own process, in the order repeat > threads > tree, so that the
trees share the machine's state alike. The model has the size of bench_ctranslate2.py's default
(vocabulary 6000, D 256, 4 heads, feed-forward 512, 2 + 2 layers, pre-norm) with random weights,
which never emit the end token: every sentence decodes exactly --max-length tokens, the same work in
every tree. Sources are random ids of 5 to 12 tokens.
"""
import argparse
import os
import subprocess
import sys
import time


def child(threads, sentences, max_length):
    import numpy as np

    import attnx
    from attnx.seq2seq import Transformer
    attnx.set_num_threads(threads)
    attnx.set_random_seed(0)
    model = Transformer(6000, 6000, model_dim=256, num_heads=4, intermediate_dim=512, num_encoder_layers=2,
                        num_decoder_layers=2, norm_first=True, dropout=0.0, start_token=1, end_token=2,
                        max_length=max_length, dtype="float32")
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 13, sentences)
    source = np.zeros((sentences, 12), np.int64)
    for i, n in enumerate(lengths):
        source[i, :n] = rng.integers(3, 6000, n)
    order = np.argsort(lengths, kind="stable")  # batches of similar lengths, as translate_batch
    model.greedy_decode(source[:2])  # warm-up: first-call allocations and the thread pool
    model.beam_search(source[:2], 4)
    for width in (1, 4):
        for batch in (1, 32):
            tokens = 0
            start = time.perf_counter()
            for lo in range(0, sentences, batch):
                rows = order[lo:lo + batch]
                rows_source = source[rows][:, :lengths[rows].max()]
                if width == 1:
                    out, _, _ = model.greedy_decode(rows_source)
                    tokens += int((out != 0).sum())
                else:
                    tokens += sum(len(hyps[0].tokens) for hyps in model.beam_search(rows_source, width))
            elapsed = time.perf_counter() - start
            print(f"threads {threads} beam {width} batch {batch:2d}: {tokens / elapsed:8.0f} tokens/s "
                  f"({tokens} tokens in {elapsed:.2f} s)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=None, help="name=PYTHONPATH of each attnx to time")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.sentences, args.max_length)
    trees = [t.split("=", 1) for t in (args.trees or ["this=" + os.path.join(os.path.dirname(__file__), "..",
                                                                             "python")])]
    for repeat in range(args.repeats):
        for threads in args.threads:
            for name, path in trees:
                print(f"--- repeat {repeat + 1}, {name} ({path})", flush=True)
                env = {**os.environ, "PYTHONPATH": os.path.abspath(path)}
                subprocess.run([sys.executable, __file__, "--child", str(threads), "--sentences", str(args.sentences),
                                "--max-length", str(args.max_length)], env=env, check=True)


if __name__ == "__main__":
    main()
