"""keras/src/layers/pooling/global_max_pooling_test.py, ported (the 1-D cases): the same inputs and
expectations. Not ported: GlobalMaxPooling2D / 3D (attnx has no such layers). attnx's layer also takes a
mask (Keras ignores one): see tests/test_keras_layers_parity.py."""
import numpy as np
import pytest

from attnx import layers
from _keras_testing import assert_all_close, run_layer_test


@pytest.mark.parametrize("data_format, keepdims, input_shape, output_shape", [
    ("channels_last", False, (3, 5, 4), (3, 4)),
    ("channels_last", True, (3, 5, 4), (3, 1, 4)),
    ("channels_first", False, (3, 5, 4), (3, 5)),
])
def test_global_max_pooling1d(data_format, keepdims, input_shape, output_shape):
    run_layer_test(layers.GlobalMaxPooling1D, init_kwargs={"data_format": data_format, "keepdims": keepdims},
                   input_shape=input_shape, expected_output_shape=output_shape, expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, expected_num_losses=0)


@pytest.mark.parametrize("data_format, keepdims", [("channels_last", False), ("channels_last", True),
                                                   ("channels_first", False), ("channels_first", True)])
def test_global_max_pooling1d_correctness(data_format, keepdims):
    inputs = np.arange(24, dtype="float32").reshape((2, 3, 4))
    layer = layers.GlobalMaxPooling1D(data_format=data_format, keepdims=keepdims)
    steps_axis = 1 if data_format == "channels_last" else 2
    assert_all_close(layer(inputs), np.max(inputs, axis=steps_axis, keepdims=keepdims))
