"""Inputs a user can get wrong (issue 31) are clear errors naming the layer: attention and transformer
layers given no array, convolution sizes the kernels cannot index, a beam wider than the vocabulary,
hard attention on non-finite images."""
import inspect

import numpy as np
import pytest

import attnx
from attnx import layers
from attnx.layers import (attention, attention_pooling, feed_forward, multi_head_attention, normalization, positions,
                          transformer)
from attnx.vision import ImageCaptioner


def _fresh_layers():
    """Every public layer class of the attention and transformer modules, made with 2 for each required
    argument."""
    found = []
    for module in (attention, attention_pooling, feed_forward, multi_head_attention, normalization, positions,
                   transformer):
        for name, cls in sorted(vars(module).items()):
            if not inspect.isclass(cls) or not issubclass(cls, layers.Layer) or cls.__module__ != module.__name__ \
                    or name.startswith("_"):
                continue
            required = [p.name for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
                        if p.default is p.empty and p.kind == p.POSITIONAL_OR_KEYWORD]
            found.append(pytest.param(cls, {k: 2 for k in required}, id=name))
    return found


@pytest.mark.parametrize("cls, kwargs", _fresh_layers())
@pytest.mark.parametrize("bad", [None, 3.0, "abc", {}, [None], [3.0, "x"], [None, None, None]],
                         ids=["None", "scalar", "string", "dict", "[None]", "[scalar, string]", "[None]*3"])
def test_attention_and_transformer_layers_refuse_what_is_not_an_array(cls, kwargs, bad):
    layer = cls(**kwargs)
    with pytest.raises((ValueError, TypeError), match=rf"Layer '{layer.name}"):
        layer(bad)


@pytest.mark.parametrize("make", [
    lambda: layers.Conv2D(4, 3, strides=2 ** 40),
    lambda: layers.Conv2D(4, (3, 2 ** 31)),
    lambda: layers.Conv2D(2 ** 31, 3),
    lambda: layers.MaxPooling2D(pool_size=2 ** 40),
    lambda: layers.AveragePooling2D(pool_size=2, strides=(1, 2 ** 33)),
], ids=["conv strides", "conv kernel_size", "conv filters", "max pool_size", "average strides"])
def test_sizes_beyond_what_the_kernels_index_are_refused_in_the_constructor(make):
    with pytest.raises(ValueError, match=r"must be at most 2147483647 \(the kernels index with C\+\+ ints\)"):
        make()


def test_a_kernel_too_large_is_refused_before_any_allocation():
    with pytest.raises(ValueError, match=r"Conv2D: a kernel \(rows, cols, filters\) on one channel of shape "
                                         r"\(65536, 65536, 4\) would hold"):
        layers.Conv2D(4, 2 ** 16)
    layer = layers.Conv2D(2 ** 14, 2 ** 7)  # 2^28 values per channel: the channels decide
    with pytest.raises(ValueError, match=rf"Layer '{layer.name}': the kernel of shape \(128, 128, 16, 16384\)"):
        layer.build((None, 200, 200, 16))


def test_a_broadcast_view_too_large_is_refused_before_it_is_copied():
    layer = layers.MaxPooling2D(2)
    huge = np.broadcast_to(np.float32(0), (2 ** 16, 2 ** 8, 2 ** 8, 2))  # 2^33 values, no memory
    with pytest.raises(ValueError, match=rf"Layer '{layer.name}': the input of shape .* would hold 8589934592"):
        layer(huge)


def _captioner(attention_kind="soft"):
    attnx.set_random_seed(0)
    x = attnx.Input((5, 7))
    encoder = attnx.Model(x, layers.Dense(6, activation="tanh")(x))
    return ImageCaptioner(encoder, (5, 7), vocab_size=9, embedding_dim=4, units=7, attention_units=5,
                          attention=attention_kind, max_length=6)


def test_beam_width_is_capped_at_the_vocabulary():
    model = _captioner()
    images = np.random.default_rng(0).standard_normal((2, 5, 7)).astype(np.float32)
    assert len(model.caption(images, width=9)) == 2
    for width in (10, 10 ** 9):
        with pytest.raises(ValueError, match=rf"`width` must be an integer in \[1, 9\] \(the target vocabulary size\), "
                                             rf"got {width}"):
            model.caption(images, width=width)


def test_hard_attention_on_nan_images_says_what_is_not_finite():
    model = _captioner("hard")
    model.compile(optimizer="adam")
    images = np.full((2, 5, 7), np.nan, np.float32)
    tokens = np.array([[1, 3, 4, 2], [1, 5, 2, 0]])
    with pytest.raises(ValueError, match=r"hard attention's reward \(the captions' log likelihood\) is NaN or "
                                         r"infinite for 2 of 2 captions"):
        model.fit(images, tokens, epochs=1, batch_size=2, verbose=0)
