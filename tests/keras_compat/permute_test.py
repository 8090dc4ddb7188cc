"""keras/src/layers/reshaping/permute_test.py, ported: the same inputs and expectations. Not ported: the
sparse case (attnx has no sparse tensors)."""
import numpy as np
import pytest

import attnx
from attnx import layers
from _keras_testing import run_layer_test


def test_permute():
    inputs = np.random.random((10, 3, 5, 5)).astype("float32")
    inputs = np.multiply(inputs, inputs >= 0.8)
    run_layer_test(layers.Permute, init_kwargs={"dims": (3, 1, 2)}, input_data=inputs,
                   expected_output=np.transpose(inputs, axes=(0, 3, 1, 2)))


def test_permute_with_dynamic_batch_size():
    input_layer = attnx.Input((3, 5))
    permuted = layers.Permute((2, 1))(input_layer)
    assert permuted.shape == (None, 5, 3)


@pytest.mark.parametrize("dims", [(0, 1, 2), (1, 4, 2)])
def test_permute_errors_on_invalid_dims(dims):
    with pytest.raises(ValueError, match=r"Invalid permutation .*dims.*"):
        run_layer_test(layers.Permute, init_kwargs={"dims": dims}, input_shape=(3, 2, 4))
