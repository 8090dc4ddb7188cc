"""Train with `attnx.data.Dataset`, checkpoint with `attnx.train.Checkpoint`, stop, and continue in a fresh
process to the same losses as a run that never stopped (TensorFlow's tf.data + tf.train.Checkpoint routine).

    python examples/resume_training.py first  --dir ckpts   # epochs 1..3, a checkpoint after each
    python examples/resume_training.py resume --dir ckpts   # a new process: restore, epochs 4..6
    python examples/resume_training.py full                 # epochs 1..6 in one go, for comparison

Each run prints its epochs' losses as JSON. What a resumed run needs, and what the checkpoint folder keeps:
the model's weights and the optimizer's step count and slots (the `Checkpoint`), and where attnx's random
stream was (`attnx.random.get_state()`: the dataset's shuffle order and the dropout masks of the next epoch
are drawn from it), saved beside the checkpoint in `random.json`.
"""
import argparse
import json
import os

import numpy as np

import attnx
from attnx import layers

EPOCHS_BEFORE_STOP, EPOCHS = 3, 6


def make_dataset():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 8)).astype("float32")
    y = (np.tanh(x @ rng.standard_normal((8, 1))) + 0.1 * rng.standard_normal((256, 1))).astype("float32")
    dataset = attnx.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=7)
    return dataset.batch(32, drop_remainder=True)


def make_model():
    model = attnx.Sequential([layers.Dense(16, activation="relu", input_shape=(8,)), layers.Dropout(0.2),
                              layers.Dense(1)])
    model.compile(optimizer=attnx.optimizers.Adam(0.01), loss="mse")
    return model


class CheckpointEachEpoch(attnx.callbacks.Callback):
    """After each epoch: the checkpoint, and the random stream's state beside it."""

    def __init__(self, checkpoint, directory):
        super().__init__()
        self.checkpoint, self.directory = checkpoint, directory

    def on_epoch_end(self, epoch, logs=None):
        self.checkpoint.save(os.path.join(self.directory, "ckpt"))
        with open(os.path.join(self.directory, "random.json"), "w") as f:
            json.dump({"epoch": epoch + 1, "random": attnx.random.get_state()}, f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=["first", "resume", "full"])
    parser.add_argument("--dir", default="training_checkpoints")
    args = parser.parse_args(argv)
    attnx.set_random_seed(0)  # the initial weights; a resumed run overwrites them from the checkpoint
    model, dataset = make_model(), make_dataset()
    checkpoint = attnx.train.Checkpoint(model=model, optimizer=model.optimizer)
    initial_epoch, epochs, callbacks = 0, EPOCHS, []
    if args.phase == "first":
        epochs, callbacks = EPOCHS_BEFORE_STOP, [CheckpointEachEpoch(checkpoint, args.dir)]
    elif args.phase == "resume":
        checkpoint.restore(attnx.train.latest_checkpoint(args.dir)).assert_consumed()
        with open(os.path.join(args.dir, "random.json")) as f:
            saved = json.load(f)
        attnx.random.set_state(saved["random"])
        initial_epoch = saved["epoch"]
    history = model.fit(dataset, epochs=epochs, initial_epoch=initial_epoch, callbacks=callbacks, verbose=0)
    print(json.dumps({"epochs": list(range(initial_epoch + 1, epochs + 1)), "loss": history.history["loss"]}))


if __name__ == "__main__":
    main()
