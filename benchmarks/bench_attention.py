"""Attention kernels against PyTorch (forward + backward, float32, same threads)."""
import numpy as np
import torch

import harness

import attnx
from attnx import layers
from attnx.layers import attention as A


def main():
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)

    # 1. scaled dot-product core, multi-head layout
    for B, H, T, d in ((32, 8, 64, 64), (16, 4, 128, 32)):
        q, k, v = f32(B, T, H * d), f32(B, T, H * d), f32(B, T, H * d)
        dc = f32(B, T, H * d)
        mask = np.ones((B, T), bool); mask[:, -T // 4:] = False

        def ax():
            c, w = A.scaled_dot_product_attention(q, k, v, mask=mask, heads=H)
            A.scaled_dot_product_attention_backward(dc, w, q, k, v, heads=H)

        tq, tk, tv = (torch.tensor(x.reshape(B, T, H, d).transpose(0, 2, 1, 3).copy(), requires_grad=True)
                      for x in (q, k, v))
        tmask = torch.tensor(mask)[:, None, None]
        tdc = torch.tensor(dc.reshape(B, T, H, d).transpose(0, 2, 1, 3).copy())

        def tx():
            out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask)
            out.backward(tdc)

        harness.compare(f"sdpa fwd+bwd B={B} H={H} T={T} d={d}", ax, tx)

    # 2. Luong general / Bahdanau additive / pooling layers
    B, Tq, S, D = 32, 20, 32, 128
    q, h = f32(B, Tq, D), f32(B, S, D)
    lengths = rng.integers(S // 2, S + 1, size=B)
    for name, layer, units in (("general", layers.Attention(score="general"), None),
                               ("additive", layers.BahdanauAdditiveAttention(units=D), D)):
        dc = f32(B, Tq, D)
        layer([q, h])

        def ax():
            c = layer([q, h], mask=[None, lengths], training=True)
            layer.backward(dc)

        p = {k: torch.tensor(v, requires_grad=True) for k, v in layer.params.items()}
        tq_, th = torch.tensor(q, requires_grad=True), torch.tensor(h, requires_grad=True)
        tmask = torch.tensor(np.arange(S)[None, :] < lengths[:, None])[:, None, :]
        tdc = torch.tensor(dc)

        def tx(name=name, p=p):
            if name == "general":
                scores = (tq_ @ p["kernel"]) @ th.transpose(1, 2)
            else:
                scores = torch.tanh((tq_ @ p["query_kernel"] + p["bias"])[:, :, None] +
                                    (th @ p["key_kernel"])[:, None]) @ p["v"][:, 0]
            w = torch.softmax(scores.masked_fill(~tmask, float("-inf")), -1)
            (w @ th).backward(tdc)

        harness.compare(f"Attention({name}) fwd+bwd B={B} Tq={Tq} S={S} D={D}", ax, tx)

    B, T, C = 32, 32, 100  # the tutorial: LSTM(100) outputs, maxlen 32
    x = f32(B, T, C)
    pool = layers.AttentionPooling()
    pool(x)
    do = f32(B, C)
    m = np.ones((B, T), bool); m[:, 20:] = False

    def ax():
        pool(x, mask=m, training=True)
        pool.backward(do)

    tx_, tW, tb = (torch.tensor(a, requires_grad=True) for a in (x, pool.params["kernel"], pool.params["bias"]))
    tm, tdo = torch.tensor(m), torch.tensor(do)

    def tx():
        e = torch.tanh(tx_ @ tW + tb)[..., 0]
        a = torch.softmax(e.masked_fill(~tm, float("-inf")), 1)
        (a[..., None] * tx_).sum(1).backward(tdo)

    harness.compare(f"AttentionPooling fwd+bwd B={B} T={T} C={C}", ax, tx)
