"""Transformer encoder layer, attnx vs PyTorch (nn.TransformerEncoderLayer, batch_first, post-norm,
relu, dropout 0.1), same weights, same threads: a training step (forward + backward of the input
and every weight) and inference (PyTorch in eval mode under inference_mode, i.e. its fused fast path)."""
import numpy as np
import torch

import attnx
from attnx.interop import from_torch
from harness import compare

SIZES = [  # (B, T, D, heads, FF)
    (32, 128, 128, 4, 512),
    (8, 512, 256, 8, 1024),
]


def bench_size(B, T, D, heads, ff):
    torch.manual_seed(0)
    module = torch.nn.TransformerEncoderLayer(D, heads, ff, dropout=0.1, batch_first=True)
    layer = from_torch(module)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    dy = rng.standard_normal((B, T, D)).astype(np.float32)
    tx, tdy = torch.from_numpy(x).requires_grad_(True), torch.from_numpy(dy)

    def attnx_train():
        layer.zero_grad()
        layer(x, training=True)
        layer.backward(dy)

    def torch_train():
        module.train()
        module.zero_grad(set_to_none=True)
        tx.grad = None
        module(tx).backward(tdy)

    def torch_infer():
        module.eval()
        with torch.inference_mode():
            module(tx.detach())

    tag = f"encoder layer B={B} T={T} D={D} h={heads} ff={ff}"
    return [compare(f"{tag} train step", attnx_train, torch_train, repeat=11),
            compare(f"{tag} inference", lambda: layer(x), torch_infer, repeat=11)]


def main():
    results = []
    for size in SIZES:
        results += bench_size(*size)
    return results


if __name__ == "__main__":
    import harness
    harness.setup_threads()
    main()
