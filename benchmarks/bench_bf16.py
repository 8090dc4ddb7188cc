"""`mixed_bfloat16` beside float32 (issue 40), one interleaved run: the training step (forward, loss,
backward, Adam) of bench_rnn's model (b), Embedding(5000, 128) -> LSTM(256) -> Dense(1), B=64, T=128, in
attnx float32, attnx under mixed_bfloat16, PyTorch float32 and PyTorch under
``torch.autocast("cpu", dtype=torch.bfloat16)``. Each round times the four in a rotated order (each
round's block after ATTNX_BENCH_SETTLE seconds of untimed runs, as harness.compare does); prints each
one's median time over the rounds and the ratios of the rounds' times, median (min-max). Benchmarks
are never tests: nothing here asserts a timing.

    python benchmarks/bench_bf16.py          (ATTNX_BENCH_THREADS, default 2; ATTNX_BENCH_ROUNDS, default 5)
"""
import statistics

import numpy as np

import bench_rnn
from harness import ROUND_TIME, ROUNDS, SETTLE, median_time, setup_threads

B, T, EMBED, UNITS = 64, 128, 128, 256


def attnx_step(policy):
    import attnx
    attnx.mixed_precision.set_global_policy(policy)
    try:
        model = bench_rnn.AttnxModel("lstm", EMBED, UNITS)
    finally:
        attnx.mixed_precision.set_global_policy(None)
    assert model.rnn.compute_dtype == ("bfloat16" if policy == "mixed_bfloat16" else "float32")
    ids, y = bench_rnn._data(B, T)
    return lambda: model.train_step(ids, y)


def torch_step(autocast):
    import torch
    train, _ = bench_rnn.torch_model("lstm", EMBED, UNITS)
    ids, y = (torch.from_numpy(a) for a in bench_rnn._data(B, T))
    if not autocast:
        return lambda: train(ids, y)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return train(ids, y)
    return step


def main():
    import attnx
    threads = setup_threads()
    print(f"threads {threads}; bf16 products: {attnx._core._bf16_config()}")
    steps = {"attnx float32": attnx_step("float32"), "attnx mixed_bfloat16": attnx_step("mixed_bfloat16"),
             "torch float32": torch_step(False), "torch autocast bf16": torch_step(True)}
    names = list(steps)
    for fn in steps.values():  # warm-up
        for _ in range(3):
            fn()
    times = {n: [] for n in names}
    for r in range(ROUNDS):
        for n in names[r % 4:] + names[:r % 4]:
            times[n].append(median_time(steps[n], 0, 3, ROUND_TIME, SETTLE))
    print(f"LSTM(256) B={B} T={T} training step, median of {ROUNDS} rounds:")
    for n in names:
        print(f"  {n:<24s} {statistics.median(times[n]) * 1e3:9.2f} ms")

    def ratio(num, den):
        r = [a / b for a, b in zip(times[num], times[den])]
        return f"{statistics.median(r):5.2f}x ({min(r):.2f}-{max(r):.2f})"
    print(f"  torch float32 / attnx mixed_bfloat16        {ratio('torch float32', 'attnx mixed_bfloat16')}")
    print(f"  torch autocast bf16 / attnx mixed_bfloat16  {ratio('torch autocast bf16', 'attnx mixed_bfloat16')}")
    print(f"  attnx float32 / attnx mixed_bfloat16        {ratio('attnx float32', 'attnx mixed_bfloat16')}")
    print(f"  torch float32 / attnx float32               {ratio('torch float32', 'attnx float32')}")
    print(f"  torch float32 / torch autocast bf16         {ratio('torch float32', 'torch autocast bf16')}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
