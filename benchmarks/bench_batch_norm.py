"""BatchNormalization: attnx's C++ kernel (batch_norm.hpp) vs the NumPy layer it replaced (commit 0f51d58's
parent, kept below as the baseline) vs PyTorch's BatchNorm, per shape and feature axis, float32 and float64:
a training call (forward with the batch's statistics, then backward: dx, dgamma, dbeta) and an inference call
(the moving statistics). attnx and NumPy run through the same layer object (its `apply` and `backprop`);
PyTorch runs nn.BatchNorm1d on (rows, C) for channels last (the same reduction, contiguous) and
nn.BatchNorm2d on (N, C, H, W) for axis 1. The masked row runs a (B, T) mask, which PyTorch has no form of.
One interleaved run: each row times the three in ATTNX_BENCH_ROUNDS rounds (5), rotating which goes first,
each round the median of at least ATTNX_BENCH_ROUND_TIME seconds of calls after ATTNX_BENCH_SETTLE seconds
of untimed ones (harness.py); prints median times and the median (min-max) over the rounds of NumPy / attnx
and torch / attnx (> 1: attnx faster). Never a test: nothing here asserts a timing."""
import argparse
import os
import platform
import statistics

import numpy as np
import torch

import attnx
from attnx.layers import BatchNormalization
from attnx.masking import as_mask
from harness import ROUND_TIME, ROUNDS, SETTLE, median_time, setup_threads

SHAPES = [((64, 50, 256), -1), ((32, 32, 32, 64), -1), ((32, 64, 16, 16), 1), ((256, 1024), -1),
          ((8, 3, 224, 224), 1)]
MASKED_SHAPE = ((64, 50, 256), -1)


class NumpyBatchNormalization(BatchNormalization):
    """The NumPy BatchNormalization of before the C++ kernel (forward and backprop as they were; the layer's
    checks, weights and config are today's, which that code shared)."""

    def forward(self, inputs, training=False, mask=None):
        x = self._float_input(inputs, min_ndim=2)
        axis = self._feature_axis(x.ndim)
        reduce = tuple(a for a in range(x.ndim) if a != axis)

        def broadcast(weight):
            shape = [1] * x.ndim
            shape[axis] = weight.shape[0]
            return weight.reshape(shape)

        gamma = broadcast(self.params["gamma"]) if self.scale else None
        beta = broadcast(self.params["beta"]) if self.center else None
        weights = None
        if mask is not None:
            m = as_mask(mask, x.shape[0], x.shape[1], f"Layer '{self.name}': `mask`")
            weights = m.reshape(m.shape + (1,) * (x.ndim - 2)).astype(self.dtype)
        if training:
            if weights is None:
                count = np.asarray(np.prod([x.shape[a] for a in reduce]), dtype=self.dtype)
                mean = x.mean(axis=reduce, keepdims=True)
                centered = x - mean
                var = np.mean(centered * centered, axis=reduce, keepdims=True)
            else:
                w = np.broadcast_to(weights, x.shape)
                count = w.sum(axis=reduce, keepdims=True) + self.dtype.type(1e-7)
                mean = (w * x).sum(axis=reduce, keepdims=True) / count
                centered = x - mean
                var = (w * centered * centered).sum(axis=reduce, keepdims=True) / count
            momentum = self.dtype.type(self.momentum)
            for name, batch in (("moving_mean", mean), ("moving_variance", var)):
                moving = self.params[name]
                moving *= momentum
                moving += batch.reshape(moving.shape) * (1 - momentum)
        else:
            mean = broadcast(self.params["moving_mean"])
            var = broadcast(self.params["moving_variance"])
            centered = x - mean
            count = None
        inv = 1.0 / np.sqrt(var + self.dtype.type(self.epsilon))
        xhat = centered * inv
        y = xhat if gamma is None else xhat * gamma
        if beta is not None:
            y = y + beta
        y = y.astype(self.dtype, copy=False)
        if not training:
            return y, None
        return y, (xhat, inv, weights, count, reduce, axis, count is not None)

    def backprop(self, cache, dy, need_dx=True):
        xhat, inv, weights, count, reduce, axis, batch_statistics = cache
        dy = self._grad_input(dy, xhat.shape)
        if self.center:
            self.grads["beta"] += dy.sum(axis=reduce)
        if self.scale:
            self.grads["gamma"] += (dy * xhat).sum(axis=reduce)
        if not need_dx:
            return None
        shape = [1] * dy.ndim
        shape[axis] = dy.shape[axis]
        dxhat = dy * self.params["gamma"].reshape(shape) if self.scale else dy
        if not batch_statistics:
            return (dxhat * inv).astype(self.dtype, copy=False)
        sum_dxhat = dxhat.sum(axis=reduce, keepdims=True)
        sum_dxhat_xhat = (dxhat * xhat).sum(axis=reduce, keepdims=True)
        dvar = -0.5 * inv * inv * sum_dxhat_xhat
        w = 1 if weights is None else weights
        dvar_dmean = 0 if weights is None else -2 * (w * xhat / inv).sum(axis=reduce, keepdims=True) / count
        dmean = -inv * sum_dxhat + dvar * dvar_dmean
        dx = inv * dxhat + w * (dmean + 2 * (xhat / inv) * dvar) / count
        return np.ascontiguousarray(dx, dtype=self.dtype)


def layer_calls(cls, x, dy, axis, mask):
    """(training call, inference call) of a built layer of class `cls`."""
    layer = cls(axis=axis, dtype=x.dtype.name)
    layer.build(x.shape)
    layer.built = True

    def train():
        y, cache = layer.apply(x, training=True, mask=mask)
        layer.backprop(cache, dy)

    return train, (lambda: layer.apply(x, training=False, mask=mask))


def torch_calls(x, dy, axis):
    """PyTorch's (training call, inference call) on the same values, its channel axis 1."""
    dtype = torch.float32 if x.dtype == np.float32 else torch.float64
    if axis in (-1, x.ndim - 1):  # channels last: the same statistics over (rows, C)
        xt, dyt = torch.from_numpy(x.reshape(-1, x.shape[-1])), torch.from_numpy(dy.reshape(-1, x.shape[-1]))
        module = torch.nn.BatchNorm1d(x.shape[-1], eps=1e-3, momentum=0.01, dtype=dtype)
    else:
        xt, dyt = torch.from_numpy(x), torch.from_numpy(dy)
        module = torch.nn.BatchNorm2d(x.shape[1], eps=1e-3, momentum=0.01, dtype=dtype)
    xt.requires_grad_(True)

    def train():
        module.train()
        xt.grad = None
        module(xt).backward(dyt)

    def infer():
        module.eval()
        with torch.no_grad():
            module(xt)

    return train, infer


def check_same_outputs(x, dy, axis, mask):
    """The kernel and the NumPy baseline agree (y and dx of a training call), so that both time the same work."""
    results = []
    for cls in (BatchNormalization, NumpyBatchNormalization):
        layer = cls(axis=axis, dtype=x.dtype.name)
        y, cache = layer.apply(x, training=True, mask=mask)
        results.append((y, layer.backprop(cache, dy)))
    tol = 1e-3 if x.dtype == np.float32 else 1e-9
    for ours, baseline in zip(*results):
        np.testing.assert_allclose(ours, baseline, rtol=tol, atol=tol)


def interleaved(fns):
    """{name: (median time, [per-round times])} of each fn, timed in ROUNDS rounds, rotating the order."""
    names = list(fns)
    for fn in fns.values():  # warm-up
        fn(), fn()
    times = {name: [] for name in names}
    for r in range(ROUNDS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(median_time(fns[name], 0, 3, ROUND_TIME, SETTLE))
    return times


def ratio_text(times, baseline, name="attnx"):
    ratios = [b / a for a, b in zip(times[name], times[baseline])]
    return f"{statistics.median(ratios):5.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,float64")
    args = parser.parse_args()
    threads = setup_threads()
    print(f"threads: {threads} (attnx and torch; NumPy's math runs on one), rounds {ROUNDS}, "
          f"{ROUND_TIME} s timed + {SETTLE} s settle per round and library; {platform.processor() or platform.machine()}, "
          f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    print(f"{'dtype':7s} {'shape':19s} {'axis':>4s} {'call':6s} {'attnx ms':>9s} {'NumPy ms':>9s} {'torch ms':>9s}  "
          f"{'NumPy/attnx (min-max)':>22s}  {'torch/attnx (min-max)':>22s}", flush=True)
    rng = np.random.default_rng(0)
    rows = [(shape, axis, False) for shape, axis in SHAPES] + [(*MASKED_SHAPE, True)]
    for dtype in args.dtypes.split(","):
        for shape, axis, masked in rows:
            x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
            dy = rng.standard_normal(shape).astype(dtype)
            mask = rng.random(shape[:2]) < 0.8 if masked else None
            ours, numpy_layer = (layer_calls(cls, x, dy, axis, mask)
                                 for cls in (BatchNormalization, NumpyBatchNormalization))
            theirs = None if masked else torch_calls(x, dy, axis)
            check_same_outputs(x, dy, axis, mask)
            for call, index in (("train", 0), ("infer", 1)):
                fns = {"attnx": ours[index], "numpy": numpy_layer[index]}
                if theirs:
                    fns["torch"] = theirs[index]
                times = interleaved(fns)
                med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
                torch_ms = f"{med['torch']:9.3f}" if theirs else f"{'-':>9s}"
                torch_ratio = ratio_text(times, "torch") if theirs else "- (no masks)"
                label = str(shape) + (" mask" if masked else "")
                print(f"{dtype:7s} {label:19s} {axis:4d} {call:6s} {med['attnx']:9.3f} {med['numpy']:9.3f} {torch_ms}  "
                      f"{ratio_text(times, 'numpy'):>22s}  {torch_ratio:>22s}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)


if __name__ == "__main__":
    main()
