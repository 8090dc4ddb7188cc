"""Subnormal inputs (~1e-39) against ordinary ones on every SIMD level this CPU runs: time of a
training step (forward and backward) of LSTM(100), the encoder layer and softmax attention pooling,
subnormal / ordinary (about 1 means subnormals cost nothing extra). attnx only, interleaved rounds.

    python benchmarks/run.py denormals
"""
import statistics

import numpy as np

import attnx
from attnx import _core, layers
from harness import ROUNDS, median_time

LEVELS = ["baseline", "avx2", "avx512"]


def _step(layer, x, dy):
    def run():
        layer(x, training=True)
        layer.backward(dy)
    return run


def main():
    rng = np.random.default_rng(0)
    cases = [("LSTM(100) B=32 T=32 C=32", lambda: layers.LSTM(100, return_sequences=True), (32, 32, 32)),
             ("encoder layer B=8 T=128 D=128", lambda: layers.TransformerEncoderLayer(4, 256), (8, 128, 128)),
             ("AttentionPooling B=32 T=32 C=100", lambda: layers.AttentionPooling(), (32, 32, 100))]
    levels = LEVELS[:LEVELS.index(_core._config()["cpu_simd_level"]) + 1]
    for name, make, shape in cases:
        attnx.set_random_seed(0)
        layer = make()
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        tiny = (x * 1e-39).astype(np.float32)
        dy = rng.uniform(-1, 1, np.shape(layer(x))).astype(np.float32)
        for level in levels:
            _core._force_simd_level(level)
            ratios, times = [], []
            _step(layer, x, dy)(), _step(layer, tiny, dy)()
            for _ in range(ROUNDS):
                normal = median_time(_step(layer, x, dy), 0, 3)
                sub = median_time(_step(layer, tiny, dy), 0, 3)
                ratios.append(sub / normal), times.append(normal)
            print(f"{name:<36s} {level:<9s} ordinary {statistics.median(times) * 1e3:8.3f} ms   "
                  f"subnormal / ordinary {statistics.median(ratios):5.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                  flush=True)
        _core._force_simd_level("avx512")


if __name__ == "__main__":
    main()
