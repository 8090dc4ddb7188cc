"""Times the same workload in attnx and in PyTorch in one process, with the same thread count,
after warm-up, and prints medians and the ratio (PyTorch time / attnx time: > 1 means attnx is
faster). Benchmarks are never tests: nothing here asserts a timing."""
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


def median_time(fn, warmup=3, repeat=15, min_time=0.0):
    """Median wall time of fn() over `repeat` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(name, attnx_fn, torch_fn, warmup=3, repeat=15):
    """Times both (interleaved in blocks so drift hits both alike); prints and returns the figures."""
    a1 = median_time(attnx_fn, warmup, repeat // 2 + 1)
    t1 = median_time(torch_fn, warmup, repeat // 2 + 1)
    a2 = median_time(attnx_fn, 1, repeat // 2 + 1)
    t2 = median_time(torch_fn, 1, repeat // 2 + 1)
    a, t = min(a1, a2), min(t1, t2)
    ratio = t / a
    print(f"{name:<48s} attnx {a * 1e3:9.3f} ms   torch {t * 1e3:9.3f} ms   torch/attnx {ratio:5.2f}x", flush=True)
    return {"name": name, "attnx_ms": a * 1e3, "torch_ms": t * 1e3, "ratio": ratio}
