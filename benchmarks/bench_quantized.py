"""int8 inference (issues 32, 39): model.quantize("int8") against attnx's own float32 and PyTorch's
torch.ao.quantization.quantize_dynamic, same threads, one interleaved run. The rows:

(a) the sentiment model Embedding(5000, 32) -> LSTM(100) -> Dense(1), B=32, T=32 (bench_rnn.py);
(b) LSTM(256), B=64, T=128, E=128; (c) BiLSTM(100), B=32, T=32, E=32 (bench_rnn.py);
(d) a Dense-heavy MLP 512 -> 1024 (relu) -> 1024 (relu) -> 10, B=256 (bench_mlp.py's large size);
(e) a transformer encoder layer's inference, B=32 T=128 D=128 h=4 ff=512 (bench_transformer.py).
    quantized, its four attention projections and the feed-forward network's two products run int8
    (the scales, bias and activation in each product's epilogue; q, k, v as one product,
    dense_forward_int8_blocks; the feed-forward network in one call, feed_forward_forward_int8);
    scores, softmax, the norms and the residuals stay float32.

(f) the sentiment model of onnx_inference.py (Embedding(5000, 32) -> LSTM(100) -> AttentionPooling -> Dense(1)),
    T=32, batch 1 and 32, one thread: `predict` of the quantized model (its compiled inference plan) against the
    float32 model's `predict` (its plan) and against the same int8 predict with the plan off (layer by layer),
    wall-clock medians interleaved round by round (onnx_inference.interleaved_ms).

Rows (a)-(e) print, in harness.compare's columns ("attnx" is always attnx int8; "torch" the other):
- vs attnx fp32 at this CPU's level (AMX tiles where it has AMX-INT8, from 16 rows; else AVX-512 VNNI),
- where the CPU has AMX-INT8: int8 with the AMX tiles vs the same int8 model on the VNNI tiles
  (_core._amx_allow(False)), and that VNNI int8 vs attnx fp32,
- vs attnx fp32 with attnx's kernels forced to the AVX2 level (_core._force_simd_level; OpenBLAS,
  which attnx's float32 calls for some products, keeps its own level),
- vs PyTorch quantize_dynamic (qint8 nn.LSTM / nn.Linear; PyTorch picks its own kernels),
- vs PyTorch float32.

Then, since a shared host's wall times are mostly waiting, the same pairs again on one thread in
process CPU time (time.process_time: only this process's work counts), interleaved, median of
CPU_ROUNDS rounds: "cpu time int8 / other".

    python benchmarks/run.py quantized
"""
import contextlib
import statistics
import time

import numpy as np

from bench_rnn import AttnxModel, _data, torch_model
from harness import compare


@contextlib.contextmanager
def simd_level(level):
    """attnx's kernels capped at `level` ("avx2", ...) inside the block; yields the int8 tiles' name."""
    from attnx import _core
    was = _core._config()["simd_level"]
    _core._force_simd_level(level)
    try:
        yield _core.int8_level()
    finally:
        _core._force_simd_level(was)


def _amx_int8_cpu():
    from attnx import _core
    return bool(_core._config().get("cpu_amx_int8"))


def without_amx(fn):
    """fn with attnx's AMX tiles off (_core._amx_allow): the int8 products of 16 rows and more on the
    VNNI tiles instead, for the A/B rows "int8 amx vs int8 vnni"."""
    from attnx import _core

    def run():
        _core._amx_allow(False)
        try:
            return fn()
        finally:
            _core._amx_allow(True)
    return run


CPU_ROUNDS = 7


def cpu_time(fn, min_seconds=0.05):
    """CPU seconds per call of fn, over at least min_seconds of CPU time."""
    calls, start = 0, time.process_time()
    while True:
        fn()
        calls += 1
        used = time.process_time() - start
        if used >= min_seconds:
            return used / calls


@contextlib.contextmanager
def one_thread():
    import torch

    import attnx
    threads = torch.get_num_threads()
    attnx.set_num_threads(1), torch.set_num_threads(1)
    try:
        yield
    finally:
        attnx.set_num_threads(threads), torch.set_num_threads(threads)


def cpu_compare(name, int8_fn, other_fn):
    """The other's CPU time over int8's on one thread (> 1: int8 is faster), interleaved rounds."""
    int8_fn(), other_fn()
    ratios, times = [], []
    for r in range(CPU_ROUNDS):
        if r % 2 == 0:  # which one goes first alternates
            a = cpu_time(int8_fn)
            b = cpu_time(other_fn)
        else:
            b = cpu_time(other_fn)
            a = cpu_time(int8_fn)
        times.append((a, b)), ratios.append(b / a)
    a = statistics.median(t for t, _ in times)
    b = statistics.median(t for _, t in times)
    print(f"{name:<60s} 1 thread, CPU time: int8 {a * 1e3:8.3f} ms  other {b * 1e3:8.3f} ms  other/int8 "
          f"{statistics.median(ratios):5.2f}x ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    return {"name": name + " (cpu time)", "ratio": statistics.median(ratios)}


def rows(name, int8_fn, fp32_fn, torch_dynamic_fn, torch_fp32_fn, err):
    print(f"{name}: attnx int8 output vs its float32: max |diff| / max |out| = {err:.4f}", flush=True)
    amx = _amx_int8_cpu()
    results = [compare(f"{name} int8 vs attnx fp32 ({_int8_level()})", int8_fn, fp32_fn)]
    if amx:  # the same int8 model, AMX tiles against VNNI tiles ("torch" columns: the VNNI run)
        results.append(compare(f"{name} int8 amx vs int8 vnni", int8_fn, without_amx(int8_fn)))
        results.append(compare(f"{name} int8 vs attnx fp32 (vnni)", without_amx(int8_fn), fp32_fn))
    with simd_level("avx2") as level:
        results.append(compare(f"{name} int8 vs attnx fp32 ({level})", int8_fn, fp32_fn))
    results.append(compare(f"{name} int8 vs torch quantize_dynamic", int8_fn, torch_dynamic_fn))
    results.append(compare(f"{name} int8 vs torch fp32", int8_fn, torch_fp32_fn))
    with one_thread():
        results.append(cpu_compare(f"{name} int8 vs attnx fp32 ({_int8_level()})", int8_fn, fp32_fn))
        if amx:
            results.append(cpu_compare(f"{name} int8 amx vs int8 vnni", int8_fn, without_amx(int8_fn)))
        with simd_level("avx2") as level:
            results.append(cpu_compare(f"{name} int8 vs attnx fp32 ({level})", int8_fn, fp32_fn))
        results.append(cpu_compare(f"{name} int8 vs torch quantize_dynamic", int8_fn, torch_dynamic_fn))
    return results


def _int8_level():
    from attnx import _core
    return _core.int8_level()


def _relative_error(got, want):
    return float(np.abs(np.asarray(got) - np.asarray(want)).max() / np.abs(np.asarray(want)).max())


def _no_grad(fn):
    import torch

    def run():
        with torch.no_grad():
            fn()
    return run


def recurrent_case(name, rnn, B, T, embed, units, bidirectional=False):
    import torch
    ids, _ = _data(B, T)
    ids_t = torch.from_numpy(ids)
    fp32 = AttnxModel(rnn, embed, units, bidirectional)
    int8 = AttnxModel(rnn, embed, units, bidirectional)
    want = int8.predict(ids)
    for layer in int8.layers:
        layer.quantize("int8")
    _, t_predict = torch_model(rnn, embed, units, bidirectional)
    qnet = torch.ao.quantization.quantize_dynamic(t_predict.module, {torch.nn.LSTM, torch.nn.GRU, torch.nn.Linear},
                                                  dtype=torch.qint8)
    return rows(name, lambda: int8.predict(ids), lambda: fp32.predict(ids), _no_grad(lambda: qnet(ids_t)),
                lambda: t_predict(ids_t), _relative_error(int8.predict(ids), want))


def mlp_case(name, B, n_in, hidden, n_out):
    import torch

    import attnx
    x = np.random.default_rng(0).standard_normal((B, n_in)).astype(np.float32)

    def build():
        attnx.set_random_seed(0)
        return attnx.Sequential([attnx.layers.Dense(hidden, activation="relu", input_shape=(n_in,)),
                                 attnx.layers.Dense(hidden, activation="relu"), attnx.layers.Dense(n_out)])
    fp32, int8 = build(), build()
    want = int8(x)
    int8.quantize("int8")
    net = torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                              torch.nn.ReLU(), torch.nn.Linear(hidden, n_out)).eval()
    qnet = torch.ao.quantization.quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)
    tx = torch.from_numpy(x)
    return rows(name, lambda: int8(x), lambda: fp32(x), _no_grad(lambda: qnet(tx)), _no_grad(lambda: net(tx)),
                _relative_error(int8(x), want))


def encoder_case(name, B, T, D, heads, ff):
    import torch

    from attnx.interop import from_torch
    torch.manual_seed(0)
    # dropout 0: the quantized module runs in training mode (below), which has no dropout then
    module = torch.nn.TransformerEncoderLayer(D, heads, ff, dropout=0.0, batch_first=True).eval()
    fp32, int8 = from_torch(module), from_torch(module)
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype(np.float32)
    want = int8(x)
    int8.quantize("int8")  # the projections and the feed-forward network (see the module docstring)
    # its quantized Linear layers fail the eval fast path's checks (their weight is a method): it runs the
    # plain path, which training mode selects
    qmodule = torch.ao.quantization.quantize_dynamic(module, {torch.nn.Linear}, dtype=torch.qint8).train()
    tx = torch.from_numpy(x)

    def torch_run(m):
        def run():
            with torch.inference_mode():
                m(tx)
        return run
    print(f"{name}: quantized weights: {sum(p.dtype == np.int8 for p in int8.params.values())} "
          f"of {len(int8.params)}")
    return rows(name, lambda: int8(x), lambda: fp32(x), torch_run(qmodule), torch_run(module),
                _relative_error(int8(x), want))


def plan_case(name, rounds=40):
    import attnx
    from onnx_inference import ids, interleaved_ms, sentiment_model, without_plan
    rng = np.random.default_rng(0)
    attnx.set_random_seed(0)
    fp32 = sentiment_model()
    int8 = sentiment_model()
    int8.set_weights(fp32.get_weights())
    batches = [ids(rng, 1, 32, 5000), ids(rng, 32, 32, 5000)]
    for x in batches:
        int8.predict(x, batch_size=len(x))
    int8.quantize("int8")
    results = []
    with one_thread():
        for x in batches:
            def planned(model=int8, x=x):
                return model.predict(x, batch_size=len(x))

            def float32(x=x):
                return fp32.predict(x, batch_size=len(x))
            err = _relative_error(planned(), float32())
            t_int8, t_fp32, t_eager = interleaved_ms([planned, float32, without_plan(planned)], rounds)
            print(f"{name} batch {len(x)}, 1 thread, wall medians: int8 plan {t_int8 * 1e3:8.1f} us  fp32 plan "
                  f"{t_fp32 * 1e3:8.1f} us  int8 eager {t_eager * 1e3:8.1f} us  fp32/int8 {t_fp32 / t_int8:5.2f}x  "
                  f"eager/plan {t_eager / t_int8:5.2f}x  (int8 vs fp32 max |diff| / max |out| {err:.4f})", flush=True)
            results.append({"name": f"{name} batch {len(x)} int8 vs fp32 predict", "ratio": t_fp32 / t_int8})
    return results


CASES = {
    "a": lambda: recurrent_case("(a) LSTM(100) B=32 T=32 E=32", "lstm", 32, 32, 32, 100),
    "b": lambda: recurrent_case("(b) LSTM(256) B=64 T=128 E=128", "lstm", 64, 128, 128, 256),
    "c": lambda: recurrent_case("(c) BiLSTM(100) B=32 T=32 E=32", "lstm", 32, 32, 32, 100, bidirectional=True),
    "d": lambda: mlp_case("(d) MLP 512-1024-1024-10 B=256", 256, 512, 1024, 10),
    "e": lambda: encoder_case("(e) encoder layer B=32 T=128 D=128 h=4 ff=512", 32, 128, 128, 4, 512),
    "f": lambda: plan_case("(f) sentiment predict, T=32"),
}


def main(rows="abcdef"):
    print(f"attnx int8 tiles at this CPU's level: {_int8_level()}")
    return [result for row in rows for result in CASES[row]()]


if __name__ == "__main__":
    import sys

    import harness
    harness.setup_threads()
    main(sys.argv[1] if len(sys.argv) > 1 else "abcdef")  # e.g. "e": the encoder layer's row alone
