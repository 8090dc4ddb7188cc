"""Times the same workload in attnx and in PyTorch in one process, with the same thread count,
after warm-up, in interleaved rounds, and prints the median ratio (PyTorch time / attnx time: > 1
means attnx is faster) with its min-max over the rounds. Benchmarks are never tests: nothing here
asserts a timing. ATTNX_BENCH_ROUNDS sets the rounds (5), ATTNX_BENCH_SETTLE and
ATTNX_BENCH_ROUND_TIME the untimed and timed seconds of each round's block."""
import os
import statistics
import time

THREADS = int(os.environ.get("ATTNX_BENCH_THREADS", "2"))


def setup_threads(threads=THREADS):
    import torch

    import attnx
    torch.set_num_threads(threads)
    attnx.set_num_threads(threads)
    return threads


ROUNDS = int(os.environ.get("ATTNX_BENCH_ROUNDS", "5"))
# Untimed runs that open each round's block, in seconds: PyTorch's OpenMP workers spin for tens of
# milliseconds after its last call (measured: attnx's CNN step ran 2x slower for its first ~50 ms
# after a PyTorch block), so each library is timed once the other's threads have gone idle, as in
# a program that runs one of them.
SETTLE = float(os.environ.get("ATTNX_BENCH_SETTLE", "0.1"))
# Timed runs per round's block: at least this many seconds of them (with 3 runs of a 4 ms step one
# slow run moved a round: the CNN's rounds of one run ranged 0.62-1.75x; 0.05 s: 1.84-2.51x)
ROUND_TIME = float(os.environ.get("ATTNX_BENCH_ROUND_TIME", "0.05"))


def median_time(fn, warmup=3, repeat=15, min_time=0.0, settle=0.0):
    """Median wall time of fn() over `repeat` runs after `warmup` runs and at least `settle` seconds
    of untimed runs."""
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    while time.perf_counter() - start < settle:
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(name, attnx_fn, torch_fn, warmup=3, repeat=15, rounds=ROUNDS):
    """Times both in `rounds` interleaved rounds (which one goes first alternates), each round the
    median of at least repeat / rounds runs and ROUND_TIME seconds of runs of each, after SETTLE
    seconds of untimed runs, so that load from other processes hits both alike; prints the median of
    the rounds' ratios (PyTorch time / attnx time) with their min-max, and the median times. Returns
    the figures."""
    for _ in range(warmup):
        attnx_fn()
        torch_fn()
    per_round = max(1, -(-repeat // rounds))
    a_times, t_times, ratios = [], [], []
    for r in range(rounds):
        if r % 2:
            t = median_time(torch_fn, 0, per_round, ROUND_TIME, SETTLE)
            a = median_time(attnx_fn, 0, per_round, ROUND_TIME, SETTLE)
        else:
            a = median_time(attnx_fn, 0, per_round, ROUND_TIME, SETTLE)
            t = median_time(torch_fn, 0, per_round, ROUND_TIME, SETTLE)
        a_times.append(a), t_times.append(t), ratios.append(t / a)
    a, t, ratio = statistics.median(a_times), statistics.median(t_times), statistics.median(ratios)
    print(f"{name:<48s} attnx {a * 1e3:9.3f} ms   torch {t * 1e3:9.3f} ms   torch/attnx {ratio:5.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f}, {rounds} rounds)", flush=True)
    return {"name": name, "attnx_ms": a * 1e3, "torch_ms": t * 1e3, "ratio": ratio,
            "ratio_min": min(ratios), "ratio_max": max(ratios)}


def torch_step_and_inference(net, loss, optimizer, x, y):
    """(training step, inference) closures of a PyTorch module on fixed tensors x, y."""
    import torch

    def step():
        optimizer.zero_grad()
        loss(net(x), y).backward()
        optimizer.step()

    def infer():
        with torch.no_grad():
            net(x)

    return step, infer
