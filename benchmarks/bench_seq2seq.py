"""Seq2seq translation model (GRU encoder + Bahdanau GRU decoder, the TensorFlow NMT tutorial's):
training step (forward, backward, Adam) and greedy decoding, attnx vs the same model in PyTorch
(examples/translate_mar_torch.py, started from the same weights)."""
import pathlib
import sys

import numpy as np
import torch

import attnx
from attnx.seq2seq import Seq2Seq
from harness import compare

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
from translate_mar_torch import TorchBahdanauSeq2Seq, train_step  # noqa: E402

B, T, E, H, V = 64, 16, 256, 512, 8000  # batch, steps (source and target), embedding, units, vocabularies


def main():
    rng = np.random.default_rng(0)
    src = rng.integers(3, V, (B, T))
    tgt = np.concatenate([np.ones((B, 1), np.int64), rng.integers(3, V, (B, T))], axis=1)  # <start> = 1
    attnx.set_random_seed(0)
    model = Seq2Seq(V, V, embedding_dim=E, units=H, attention="bahdanau", start_token=1, end_token=2, max_length=T)
    model.build(T)
    net = TorchBahdanauSeq2Seq(V, V, E, H).copy_from(model)
    model.compile(attnx.optimizers.Adam(1e-3))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0)
    tsrc, ttgt = torch.from_numpy(src), torch.from_numpy(tgt)
    label = f"B={B} T={T} E={E} H={H} V={V}"
    compare(f"seq2seq Bahdanau train step {label}", lambda: model.train_on_batch(src, tgt),
            lambda: train_step(net, opt, loss_fn, tsrc, ttgt), warmup=2, repeat=9)
    # decoding never stops early: no end token in the vocabulary's reach
    model.end_id = -1
    compare(f"seq2seq Bahdanau greedy decode {label}", lambda: model.greedy_decode(src, max_length=T),
            lambda: net.greedy(tsrc, 1, -1, T), warmup=2, repeat=9)


if __name__ == "__main__":
    from harness import setup_threads
    print(f"threads: {setup_threads()} (attnx and torch)")
    main()
