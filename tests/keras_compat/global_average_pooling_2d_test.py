"""keras/src/layers/pooling/global_average_pooling_test.py, ported (the 2-D cases; the 1-D ones are in
global_average_pooling_test.py): the same shapes and expectations."""
import numpy as np
import pytest

from attnx import layers
from _keras_testing import assert_all_close, run_layer_test


@pytest.mark.parametrize("data_format, keepdims, input_shape, output_shape", [
    ("channels_last", False, (3, 5, 6, 4), (3, 4)),
    ("channels_last", True, (3, 5, 6, 4), (3, 1, 1, 4)),
    ("channels_first", False, (3, 5, 6, 4), (3, 5)),
])
def test_global_average_pooling2d(data_format, keepdims, input_shape, output_shape):
    run_layer_test(layers.GlobalAveragePooling2D, init_kwargs={"data_format": data_format, "keepdims": keepdims},
                   input_shape=input_shape, expected_output_shape=output_shape, expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, expected_num_losses=0)


@pytest.mark.parametrize("data_format, keepdims", [("channels_last", False), ("channels_last", True),
                                                   ("channels_first", False), ("channels_first", True)])
def test_global_average_pooling2d_correctness(data_format, keepdims):
    inputs = np.arange(96, dtype="float32").reshape((2, 3, 4, 4))
    layer = layers.GlobalAveragePooling2D(data_format=data_format, keepdims=keepdims)
    axes = (1, 2) if data_format == "channels_last" else (2, 3)
    assert_all_close(layer(inputs), np.mean(inputs, axis=axes, keepdims=keepdims))
