"""MLP training step (forward, backward, Adam update) and inference: attnx vs PyTorch."""
import numpy as np
import torch

import attnx
from harness import compare, torch_step_and_inference

SIZES = [(32, 64, 128, 1), (256, 512, 1024, 10)]  # batch, in, hidden, out


def build(batch, n_in, hidden, n_out):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    y = rng.integers(0, n_out, batch) if n_out > 1 else rng.integers(0, 2, batch).astype(np.float32)

    attnx.set_random_seed(0)
    model = attnx.Sequential([attnx.layers.Dense(hidden, activation="relu", input_shape=(n_in,)),
                              attnx.layers.Dense(hidden, activation="relu"),
                              attnx.layers.Dense(n_out)])
    loss = (attnx.losses.SparseCategoricalCrossentropy(from_logits=True) if n_out > 1
            else attnx.losses.BinaryCrossentropy(from_logits=True))
    model.compile(optimizer=attnx.optimizers.Adam(), loss=loss)

    net = torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                              torch.nn.ReLU(), torch.nn.Linear(hidden, n_out))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    tloss = torch.nn.CrossEntropyLoss() if n_out > 1 else torch.nn.BCEWithLogitsLoss()
    tx = torch.from_numpy(x)
    ty = torch.from_numpy(y) if n_out > 1 else torch.from_numpy(y).reshape(-1, 1)

    torch_step, torch_infer = torch_step_and_inference(net, tloss, opt, tx, ty)
    return (lambda: model.train_on_batch(x, y)), torch_step, (lambda: model(x)), torch_infer


def main():
    for size in SIZES:
        attnx_step, torch_step, attnx_infer, torch_infer = build(*size)
        label = "B={} in={} hidden={} out={}".format(*size)
        compare(f"MLP train step {label}", attnx_step, torch_step)
        compare(f"MLP inference  {label}", attnx_infer, torch_infer)
