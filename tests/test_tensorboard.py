"""`attnx.callbacks.TensorBoard`: the event files it writes read back with TensorBoard's own reader, the
same scalars as fit's history, tagged as Keras tags them."""
import numpy as np
import pytest

import attnx
from attnx import layers
from attnx.callbacks import TensorBoard, _masked_crc32c

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_crc32c_known_value():
    # CRC-32C of "123456789" is 0xE3069283 (RFC 3720); TFRecord masks it
    crc = 0xE3069283
    assert _masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _read(folder):
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize("update_freq", ["epoch", 2])
def test_tensorboard_scalars_read_back(tmp_path, update_freq):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((12, 3)).astype("float32"), rng.standard_normal((12, 1)).astype("float32")
    model = attnx.Sequential([layers.Dense(1, input_shape=(3,))])
    model.compile("sgd", "mse", metrics=["mae"])
    history = model.fit(x, y, batch_size=4, epochs=3, validation_data=(x, y), verbose=0,
                        callbacks=[TensorBoard(tmp_path / "logs", update_freq=update_freq)]).history
    train, validation = _read(tmp_path / "logs" / "train"), _read(tmp_path / "logs" / "validation")
    for key in ("loss", "mae"):
        assert [s for s, _ in train[f"epoch_{key}"]] == [0, 1, 2]
        np.testing.assert_allclose([v for _, v in train[f"epoch_{key}"]], history[key], rtol=1e-6)
        np.testing.assert_allclose([v for _, v in validation[f"epoch_{key}"]], history[f"val_{key}"], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in train["epoch_learning_rate"]], [0.01] * 3, rtol=1e-6)
    if update_freq == 2:
        assert [s for s, _ in train["batch_loss"]] == [2, 4, 6, 8]
    else:
        assert "batch_loss" not in train


def test_tensorboard_bad_update_freq():
    with pytest.raises(ValueError, match="update_freq"):
        TensorBoard(update_freq=0)
