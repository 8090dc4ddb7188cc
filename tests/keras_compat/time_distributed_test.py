"""keras/src/layers/rnn/time_distributed_test.py, ported: the same inputs, initializers and expected
values. Not ported: test_masking (a Keras `Wrapper` subclass reading the mask per step: attnx's
TimeDistributed calls the wrapped layer without a mask and passes the mask on); the mask errors are
attnx's mask rule's words."""
import numpy as np
import pytest

import attnx
from attnx import initializers, layers
from _keras_testing import assert_all_close, run_layer_test


def test_basics():
    run_layer_test(layers.TimeDistributed, init_kwargs={"layer": layers.Dense(1, use_bias=False)},
                   input_shape=(3, 2, 4), expected_output_shape=(3, 2, 1), expected_num_trainable_weights=1,
                   expected_num_non_trainable_weights=0, supports_masking=True)


def test_build():
    inputs = attnx.Input((10, 128, 128, 3), batch_size=32)
    outputs = layers.TimeDistributed(layers.Conv2D(64, (3, 3)))(inputs)
    assert outputs.shape == (32, 10, 126, 126, 64)


def test_correctness():
    sequence = np.arange(24).reshape((3, 2, 4)).astype("float32")
    layer = layers.TimeDistributed(layer=layers.Dense(1, kernel_initializer=initializers.Constant(0.01),
                                                      use_bias=False))
    assert_all_close(layer(sequence), np.array([[[0.06], [0.22]], [[0.38], [0.53999996]], [[0.7], [0.86]]]))


def test_with_mask_zero():
    model = attnx.Sequential([layers.Embedding(input_dim=10, output_dim=5, mask_zero=True, input_shape=(20,)),
                              layers.TimeDistributed(layers.Dense(units=5, activation="softmax"))])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x_train = np.random.uniform(1, 10, size=(22, 20)).astype("int64")
    y_train = np.random.randint(1, 2, size=(22, 20))
    model.fit(x_train, y_train, epochs=1, batch_size=16, verbose=0)


@pytest.mark.parametrize("shape", [(4, 6), (5, 5)])
def test_mask_validation_with_mismatched_shapes(shape):
    td = layers.TimeDistributed(layers.Dense(units=5, activation="softmax"))
    inputs = np.zeros((4, 5, 3))
    assert td(inputs, mask=np.ones((4, 5), dtype=bool)).shape == (4, 5, 5)
    with pytest.raises(ValueError, match=r"`mask`.*expected a mask of shape"):
        td(inputs, mask=np.ones(shape, dtype=bool))
