"""CSVLogger, ReduceLROnPlateau and BackupAndRestore with Keras' semantics, on a Sequential model
and on Seq2Seq training: a fit killed mid-epoch and resumed from its backup ends with the weights
of the uninterrupted run, bit for bit."""
import csv
import itertools
import os

import numpy as np
import pytest

import attnx
from attnx import callbacks, layers, optimizers
from attnx.seq2seq import Seq2Seq


def classification_data(n=48, d=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x, (x[:, :1] - 0.5 * x[:, 2:3] > 0).astype(np.float32)


def dropout_mlp(lr=0.01):
    """Dropout and shuffling draw from attnx's generator: resuming must restore it too."""
    attnx.set_random_seed(7)
    model = attnx.Sequential([layers.Dense(8, activation="relu", input_shape=(6,)), layers.Dropout(0.3),
                              layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=optimizers.Adam(lr), loss="binary_crossentropy", metrics=["accuracy"])
    return model


def seq2seq_data(n=30, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, 13, (n, 5))
    tgt = np.concatenate([np.ones((n, 1), np.int64), src[:, ::-1], np.full((n, 1), 2)], axis=1)
    return src, tgt


def seq2seq_model(lr=0.01):
    attnx.set_random_seed(7)
    model = Seq2Seq(13, 13, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=8)
    model.compile(optimizers.Adam(lr))
    return model


def assert_same_weights(a, b):
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)


class Crash(RuntimeError):
    pass


def crash_at(global_batch):
    """A callback that raises at the end of the `global_batch`-th batch of the fit (from 0)."""
    count = itertools.count()

    def hook(batch, logs):
        if next(count) == global_batch:
            raise Crash(f"killed after batch {global_batch}")
    return callbacks.LambdaCallback(on_train_batch_end=hook)


# ------------------------------------------------------------------- CSVLogger
def test_csv_logger_writes_a_row_per_epoch_and_appends(tmp_path):
    x, y = classification_data()
    path = tmp_path / "log.csv"
    model = dropout_mlp()
    history = model.fit(x, y, epochs=3, batch_size=16, validation_data=(x[:8], y[:8]), verbose=0,
                        callbacks=[callbacks.CSVLogger(path)])
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["epoch", "accuracy", "loss", "val_accuracy", "val_loss"]
    assert [r[0] for r in rows[1:]] == ["0", "1", "2"]
    for row, loss in zip(rows[1:], history.history["loss"]):
        assert float(row[2]) == loss
    model.fit(x, y, epochs=5, initial_epoch=3, batch_size=16, verbose=0,
              callbacks=[callbacks.CSVLogger(path, separator=";", append=True)])
    lines = path.read_text().splitlines()
    assert len(lines) == 6 and lines[4].startswith("3;") and lines[5].startswith("4;")
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[callbacks.CSVLogger(path)])
    assert path.read_text().splitlines()[0] == "epoch,accuracy,loss"  # append=False starts the file anew


# ------------------------------------------------------------ ReduceLROnPlateau
def scripted_monitor(values):
    """A callback that sets logs['score'] at each epoch end, before the callbacks after it read it."""
    return callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: logs.update(score=values[epoch]))


def learning_rates(model, values, **kwargs):
    seen = []
    model.fit(*classification_data(8), epochs=len(values), batch_size=8, verbose=0, callbacks=[
        scripted_monitor(values), callbacks.ReduceLROnPlateau(monitor="score", **kwargs),
        callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(
            (logs["learning_rate"], model.optimizer.learning_rate)))])
    return seen


def test_reduce_lr_on_plateau_after_patience_with_cooldown_and_floor():
    model = dropout_mlp(lr=1.0)
    # improves, then flat: the 2nd flat epoch reaches patience 2; after a reduction the count
    # restarts once the cooldown of 2 epochs has run down (Keras counts the epoch it ends)
    seen = learning_rates(model, [5.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0], factor=0.5, patience=2, cooldown=2)
    # logs hold the rate the epoch trained with; the optimizer the rate after the callback
    assert [s[1] for s in seen] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]
    assert [s[0] for s in seen] == [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]
    model.optimizer.learning_rate = 1.0
    assert learning_rates(model, [4.0] * 8, factor=0.5, patience=1, min_lr=0.2)[-1][1] == 0.2


def test_reduce_lr_on_plateau_min_delta_and_max_mode():
    model = dropout_mlp(lr=1.0)
    # an improvement smaller than min_delta is no improvement
    assert learning_rates(model, [1.0, 0.95, 0.9], patience=2, min_delta=0.1)[-1][1] == pytest.approx(0.1)
    model.optimizer.learning_rate = 1.0
    assert learning_rates(model, [0.1, 0.2, 0.3], patience=1, mode="max")[-1][1] == 1.0
    with pytest.raises(ValueError, match="factor must be in"):
        callbacks.ReduceLROnPlateau(factor=1.0)
    with pytest.raises(KeyError, match="'val_loss' is not in the logs"):
        model.fit(*classification_data(8), verbose=0, callbacks=[callbacks.ReduceLROnPlateau()])
    model.compile(optimizer=optimizers.SGD(optimizers.ExponentialDecay(0.1, 10, 0.5)), loss="mse")
    with pytest.raises(ValueError, match="learning rate is a schedule"):
        model.fit(*classification_data(8), verbose=0, callbacks=[callbacks.ReduceLROnPlateau(monitor="loss")])


# ------------------------------------------------------------- BackupAndRestore
def uninterrupted(make_model, data, **fit_kwargs):
    model = make_model()
    model.fit(*data, **fit_kwargs)
    return model


# (save_freq, the batch after which the fit dies, the backup left, the epochs the resumed fit runs):
# 3 epochs of 5 batches; the backup is taken before the crash at the same batch
BACKUP_CASES = [("epoch", 9, "model-0.attnx", [1, 2]), (2, 9, "model-4.attnx", [1, 2]),
                (2, 6, "model-2.attnx", [1, 2]), (1, 4, "model-4.attnx", [0, 1, 2]), (3, 0, None, [0, 1, 2])]


@pytest.mark.parametrize("save_freq, crash, backup_file, epochs_resumed", BACKUP_CASES)
def test_backup_and_restore_resumes_a_killed_fit_bit_for_bit(tmp_path, save_freq, crash, backup_file,
                                                            epochs_resumed):
    data = classification_data()
    fit_kwargs = dict(epochs=3, batch_size=10, shuffle=True, validation_data=classification_data(10, seed=1),
                      verbose=0)  # 5 batches per epoch (the last one of 8 samples)
    expected = uninterrupted(dropout_mlp, data, **fit_kwargs)
    backup = callbacks.BackupAndRestore(tmp_path / "backup", save_freq=save_freq)
    with pytest.raises(Crash):
        dropout_mlp().fit(*data, callbacks=[backup, crash_at(crash)], **fit_kwargs)
    assert sorted(os.listdir(tmp_path / "backup")) == ([] if backup_file is None else ["backup.json", backup_file])
    attnx.set_random_seed(123)  # as a new process: other weights and another generator state until restored
    resumed = dropout_mlp()
    epochs_run = []
    resumed.fit(*data, callbacks=[callbacks.BackupAndRestore(tmp_path / "backup", save_freq=save_freq),
                                  callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epochs_run.append(e))],
                **fit_kwargs)
    assert_same_weights(resumed, expected)
    assert epochs_run == epochs_resumed
    assert resumed.optimizer.iterations == expected.optimizer.iterations == 15
    assert os.listdir(tmp_path / "backup") == []  # a completed fit deletes the backup


def test_backup_and_restore_resumes_a_generator_that_crashed(tmp_path):
    x, y = classification_data()

    def batches(crash_at=None):
        for i in itertools.count():
            if i == crash_at:
                raise Crash(f"the data source failed at batch {i}")
            start = (i * 8) % 40
            yield x[start:start + 8], y[start:start + 8]
    fit_kwargs = dict(epochs=3, steps_per_epoch=4, verbose=0)
    expected = dropout_mlp()
    expected.fit(batches(), **fit_kwargs)
    with pytest.raises(Crash):
        dropout_mlp().fit(batches(crash_at=7), callbacks=[callbacks.BackupAndRestore(tmp_path, save_freq=1)],
                          **fit_kwargs)
    resumed = dropout_mlp()
    resumed.fit(batches(), callbacks=[callbacks.BackupAndRestore(tmp_path, save_freq=1)], **fit_kwargs)
    assert_same_weights(resumed, expected)


def test_backup_keeps_the_reduced_learning_rate_and_can_be_kept(tmp_path):
    data = classification_data(16)
    model = dropout_mlp(lr=0.5)
    model.fit(*data, epochs=2, batch_size=8, verbose=0, callbacks=[
        callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=10.0, factor=0.5),
        callbacks.BackupAndRestore(tmp_path, delete_checkpoint=False)])
    assert model.optimizer.learning_rate == 0.25  # the first epoch improves on nothing
    assert sorted(os.listdir(tmp_path)) == ["backup.json", "model-1.attnx"]
    resumed = dropout_mlp(lr=0.5)
    epochs_run = []
    resumed.fit(*data, epochs=3, batch_size=8, verbose=0, callbacks=[
        callbacks.BackupAndRestore(tmp_path), callbacks.LambdaCallback(
            on_epoch_begin=lambda e, logs: epochs_run.append((e, resumed.optimizer.learning_rate)))])
    assert epochs_run == [(2, 0.25)]


def test_backup_and_restore_arguments():
    for bad in (0, -1, "batch", 1.5, True):
        with pytest.raises(ValueError, match="save_freq must be 'epoch' or a positive number of batches"):
            callbacks.BackupAndRestore("somewhere", save_freq=bad)
    model = attnx.Sequential([layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="BackupAndRestore: the model must have its weights"):
        model.fit(iter([(np.ones((2, 3)), np.ones((2, 1)))]), verbose=0,
                  callbacks=[callbacks.BackupAndRestore("somewhere")])
    with pytest.raises(RuntimeError, match="only defined while fit runs"):
        model.training_state()


# ----------------------------------------------------------- on Seq2Seq training
def test_callbacks_on_seq2seq_training(tmp_path):
    src, tgt = seq2seq_data()
    val = seq2seq_data(8, seed=1)
    fit_kwargs = dict(epochs=3, batch_size=8, validation_data=val, verbose=0)
    expected = seq2seq_model()
    expected.fit(src, tgt, callbacks=[callbacks.ReduceLROnPlateau(patience=0, min_delta=100.0, factor=0.5)],
                 **fit_kwargs)
    assert expected.optimizer.learning_rate == 0.01 * 0.5 ** 2

    def run(extra):
        return [callbacks.ReduceLROnPlateau(patience=0, min_delta=100.0, factor=0.5),  # adds learning_rate to
                callbacks.CSVLogger(tmp_path / "seq2seq.csv", append=True),                # the logs this writes
                callbacks.BackupAndRestore(tmp_path / "backup", save_freq=3)] + extra
    # killed in the first epoch (4 batches), backed up after its 3rd batch: the other callbacks' state
    # is not backed up (as in Keras), and in epoch 0 there is none yet
    with pytest.raises(Crash):
        seq2seq_model().fit(src, tgt, callbacks=run([crash_at(3)]), **fit_kwargs)
    resumed = seq2seq_model()
    resumed.fit(src, tgt, callbacks=run([]), **fit_kwargs)
    assert_same_weights(resumed, expected)
    assert resumed.optimizer.learning_rate == expected.optimizer.learning_rate
    rows = list(csv.DictReader((tmp_path / "seq2seq.csv").open()))
    assert [r["epoch"] for r in rows] == ["0", "1", "2"]
    assert [float(r["learning_rate"]) for r in rows] == [0.01, 0.01, 0.005]
