"""Small CNN training step (forward, backward, Adam update) and inference: attnx vs PyTorch.
(64, 32, 32, 1) images -> Conv2D(16, 3, same, relu) -> MaxPool 2 -> Conv2D(32, 3, same, relu) -> MaxPool 2
-> Flatten -> Dense(10), softmax cross-entropy. PyTorch runs the same network in its own layout (NCHW)."""
import numpy as np
import torch

import attnx
from harness import compare, torch_step_and_inference

BATCH, SIDE, CLASSES = 64, 32, 10


def build():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIDE, SIDE, 1)).astype(np.float32)
    y = rng.integers(0, CLASSES, BATCH)

    attnx.set_random_seed(0)
    L = attnx.layers
    model = attnx.Sequential([L.Conv2D(16, 3, padding="same", activation="relu", input_shape=(SIDE, SIDE, 1)),
                              L.MaxPooling2D(2), L.Conv2D(32, 3, padding="same", activation="relu"),
                              L.MaxPooling2D(2), L.Flatten(), L.Dense(CLASSES)])
    model.compile(optimizer=attnx.optimizers.Adam(),
                  loss=attnx.losses.SparseCategoricalCrossentropy(from_logits=True))

    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(32 * (SIDE // 4) ** 2, CLASSES))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    tloss = nn.CrossEntropyLoss()
    tx = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    ty = torch.from_numpy(y)

    torch_step, torch_infer = torch_step_and_inference(net, tloss, opt, tx, ty)
    return (lambda: model.train_on_batch(x, y)), torch_step, (lambda: model(x)), torch_infer


def main():
    attnx_step, torch_step, attnx_infer, torch_infer = build()
    label = f"B={BATCH} {SIDE}x{SIDE}x1 conv16-pool-conv32-pool-dense{CLASSES}"
    compare(f"CNN train step {label}", attnx_step, torch_step)
    compare(f"CNN inference  {label}", attnx_infer, torch_infer)


if __name__ == "__main__":
    from harness import setup_threads
    print(f"threads: {setup_threads()} (attnx and torch)")
    main()
