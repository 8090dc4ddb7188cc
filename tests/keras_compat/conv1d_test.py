"""keras/src/layers/convolutional/conv_test.py, ported (the 1-D cases): the same arguments, shapes and
expectations, against a NumPy convolution written here. Not ported: channels_first (attnx's Conv1D is
channels last: a clear error), LoRA, constraints, 2-D / 3-D (Conv2D has its own tests)."""
import numpy as np
import pytest

from attnx import layers
from _keras_testing import assert_all_close, run_layer_test


def np_conv1d(x, kernel, bias, strides, padding, dilation_rate, groups):
    """TensorFlow's convolution over steps, by its definition (zeros padded as the padding says)."""
    size, channels, filters = kernel.shape
    span = (size - 1) * dilation_rate + 1
    steps = x.shape[1]
    if padding == "causal":
        x = np.pad(x, ((0, 0), (span - 1, 0), (0, 0)))
    elif padding == "same":
        out = -(-steps // strides)
        total = max((out - 1) * strides + span - steps, 0)
        x = np.pad(x, ((0, 0), (total // 2, total - total // 2), (0, 0)))
    out_steps = (x.shape[1] - span) // strides + 1
    per_group = filters // groups
    y = np.zeros((x.shape[0], out_steps, filters))
    for t in range(out_steps):
        for k in range(size):
            step = x[:, t * strides + k * dilation_rate]
            for g in range(groups):
                f = slice(g * per_group, (g + 1) * per_group)
                y[:, t, f] += step[:, g * channels:(g + 1) * channels] @ kernel[k, :, f]
    return y + bias


BASIC = [
    dict(filters=5, kernel_size=2, strides=1, padding="valid", dilation_rate=1, groups=1, input_shape=(3, 5, 4),
         output_shape=(3, 4, 5)),
    dict(filters=6, kernel_size=2, strides=1, padding="same", dilation_rate=(2,), groups=2, input_shape=(3, 4, 4),
         output_shape=(3, 4, 6)),
    dict(filters=6, kernel_size=2, strides=1, padding="causal", dilation_rate=(2,), groups=2, input_shape=(3, 4, 4),
         output_shape=(3, 4, 6)),
    dict(filters=6, kernel_size=2, strides=(2,), padding="valid", dilation_rate=1, groups=2, input_shape=(3, 5, 4),
         output_shape=(3, 2, 6)),
]


@pytest.mark.parametrize("case", BASIC)
def test_conv1d_basic(case):
    case = dict(case)
    input_shape, output_shape = case.pop("input_shape"), case.pop("output_shape")
    run_layer_test(layers.Conv1D, init_kwargs=case, input_shape=input_shape, expected_output_shape=output_shape,
                   expected_num_trainable_weights=2, expected_num_non_trainable_weights=0, expected_num_losses=0)


def test_bad_init_args():
    with pytest.raises(ValueError):
        layers.Conv1D(filters=0, kernel_size=1)
    with pytest.raises(ValueError):
        layers.Conv1D(filters=5, kernel_size=2, groups=2)  # filters not a multiple of groups


@pytest.mark.parametrize("case", [
    dict(filters=5, kernel_size=2, strides=1, padding="valid", dilation_rate=1, groups=1),
    dict(filters=6, kernel_size=2, strides=1, padding="same", dilation_rate=(2,), groups=2),
    dict(filters=6, kernel_size=2, strides=1, padding="causal", dilation_rate=(2,), groups=2),
    dict(filters=6, kernel_size=(2,), strides=(2,), padding="valid", dilation_rate=1, groups=2),
    dict(filters=4, kernel_size=3, strides=2, padding="same", dilation_rate=1, groups=1),
])
def test_conv1d(case):
    layer = layers.Conv1D(**case)
    inputs = np.random.normal(size=[2, 8, 4])
    layer.build(inputs.shape)
    layer.built = True  # Keras' build marks the layer built
    kernel = np.random.normal(size=layer.params["kernel"].shape)
    bias = np.random.normal(size=(case["filters"],))
    layer.set_weights([kernel, bias])
    dilation = case["dilation_rate"][0] if isinstance(case["dilation_rate"], tuple) else case["dilation_rate"]
    strides = case["strides"][0] if isinstance(case["strides"], tuple) else case["strides"]
    expected = np_conv1d(inputs, kernel, bias, strides, case["padding"], dilation, case["groups"])
    assert_all_close(layer(inputs), expected, atol=1e-5, rtol=1e-5)


def test_conv_raises_exception_on_zero_dims():
    with pytest.raises(ValueError):
        layers.Conv1D(2, 3)(np.zeros((2, 0, 3), np.float32))
