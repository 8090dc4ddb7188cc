"""Recurrent encoders against PyTorch (issue 3), same threads, one run:

(a) the tutorial's sentiment model Embedding(5000, 32) -> LSTM(100) -> Dense(1), B=32, T=32:
    training step (forward, loss, backward, Adam) and inference (forward);
(b) Embedding(5000, 128) -> LSTM(256) -> Dense(1), B=64, T=128: training step, inference, and
    the peak memory of training, each framework in a fresh subprocess (peak RSS above the RSS
    before the first step, via /proc/self/clear_refs and VmHWM);
(c) GRU and bidirectional LSTM variants of (a).

    python benchmarks/run.py rnn
"""
import json
import subprocess
import sys

import numpy as np

from harness import compare

VOCAB = 5000


class AttnxModel:
    def __init__(self, rnn, embed, units, bidirectional=False):
        import attnx
        from attnx.layers import GRU, LSTM, Bidirectional, Dense, Embedding
        attnx.set_random_seed(0)
        self.emb = Embedding(VOCAB, embed)
        self.rnn = {"lstm": LSTM, "gru": GRU}[rnn](units)
        if bidirectional:
            self.rnn = Bidirectional(self.rnn)
        self.dense = Dense(1)
        self.layers = [self.emb, self.rnn, self.dense]
        self.loss = attnx.losses.BinaryCrossentropy(from_logits=True)
        self.opt = attnx.optimizers.Adam()

    def predict(self, ids):
        return self.dense(self.rnn(self.emb(ids)))

    def train_step(self, ids, y):
        for layer in self.layers:
            layer.zero_grad()
        logits = self.dense(self.rnn(self.emb(ids, training=True), training=True), training=True)
        loss, dlogits = self.loss.compute(y, logits)
        self.emb.backward(self.rnn.backward(self.dense.backward(dlogits)))
        self.opt.apply([(p, g) for layer in self.layers for _, p, g in layer.trainable_params])
        return loss


def torch_model(rnn, embed, units, bidirectional=False):
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, embed)
            self.rnn = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[rnn](embed, units, batch_first=True,
                                                                         bidirectional=bidirectional)
            self.dense = torch.nn.Linear(units * (2 if bidirectional else 1), 1)

        def forward(self, ids):
            _, h = self.rnn(self.emb(ids))
            h = h[0] if isinstance(h, tuple) else h
            last = torch.cat([h[-2], h[-1]], dim=1) if bidirectional else h[-1]
            return self.dense(last)

    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.Adam(model.parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def train_step(ids, y):
        opt.zero_grad()
        loss = loss_fn(model(ids), y)
        loss.backward()
        opt.step()
        return loss

    def predict(ids):
        with torch.no_grad():
            return model(ids)
    predict.module = model  # for bench_quantized's quantize_dynamic
    return train_step, predict


def _data(B, T, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(B, T))
    y = rng.integers(0, 2, size=(B, 1)).astype(np.float32)
    return ids, y


def run_case(name, rnn, B, T, embed, units, bidirectional=False, inference=True):
    import torch
    ids, y = _data(B, T)
    ids_t, y_t = torch.from_numpy(ids), torch.from_numpy(y)
    ours = AttnxModel(rnn, embed, units, bidirectional)
    t_train, t_predict = torch_model(rnn, embed, units, bidirectional)
    results = [compare(f"{name} train step", lambda: ours.train_step(ids, y), lambda: t_train(ids_t, y_t))]
    if inference:
        results.append(compare(f"{name} inference", lambda: ours.predict(ids), lambda: t_predict(ids_t)))
    return results


# ---------------------------------------------------------------------------- peak memory
_MEMORY_SCRIPT = r"""
import json, sys
sys.path.insert(0, {bench_dir!r})
framework = {framework!r}
B, T, E, H = 64, 128, 128, 256

def rss_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

if framework == "attnx":  # torch is never imported here
    import attnx, bench_rnn
    attnx.set_num_threads(2)
    ids, y = bench_rnn._data(B, T)
    model = bench_rnn.AttnxModel("lstm", E, H)
    step = lambda: model.train_step(ids, y)
else:
    import torch, bench_rnn
    torch.set_num_threads(2)
    ids, y = bench_rnn._data(B, T)
    train, _ = bench_rnn.torch_model("lstm", E, H)
    ids_t, y_t = torch.from_numpy(ids), torch.from_numpy(y)
    step = lambda: train(ids_t, y_t)
base = rss_kib("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the current RSS
for _ in range(3):
    step()
print(json.dumps({{"base_kib": base, "peak_kib": rss_kib("VmHWM")}}))
"""


def peak_memory(framework):
    """Peak resident memory (MiB) above the resident memory before training, over 3 training steps of
    (b) in a fresh interpreter that imports only its own framework (the peak counter is reset after
    imports and model creation)."""
    import pathlib
    script = _MEMORY_SCRIPT.format(bench_dir=str(pathlib.Path(__file__).parent), framework=framework)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return (figures["peak_kib"] - figures["base_kib"]) / 1024


def main():
    results = []
    results += run_case("(a) LSTM(100) B=32 T=32 E=32", "lstm", 32, 32, 32, 100)
    results += run_case("(b) LSTM(256) B=64 T=128 E=128", "lstm", 64, 128, 128, 256)
    results += run_case("(c) GRU(100) B=32 T=32 E=32", "gru", 32, 32, 32, 100)
    results += run_case("(c) BiLSTM(100) B=32 T=32 E=32", "lstm", 32, 32, 32, 100, bidirectional=True)
    results += run_case("(c) BiGRU(100) B=32 T=32 E=32", "gru", 32, 32, 32, 100, bidirectional=True)
    ours, theirs = peak_memory("attnx"), peak_memory("torch")
    print(f"{'(b) training peak RSS above baseline':<48s} attnx {ours:9.1f} MiB  torch {theirs:9.1f} MiB   "
          f"torch/attnx {theirs / max(ours, 1e-9):5.2f}x", flush=True)
    return results
