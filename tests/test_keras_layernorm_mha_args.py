"""LayerNormalization's axis checks and MultiHeadAttention's attention_axes, use_gate, constraints and
regularizers (issue 41) against Keras 3 itself on its PyTorch backend: the same outputs on the same weights
(float32 noise), the same input and weight gradients (torch autograd through the Keras layer), float64
gradient checks, and the same errors where Keras raises one."""
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
torch = pytest.importorskip("torch")

from attnx import constraints, layers, regularizers  # noqa: E402
from attnx.testing import gradcheck  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch", reason="Keras on its torch backend")


def _close(a, b, atol=2e-5, rtol=2e-4):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), atol=atol, rtol=rtol)


# ---- LayerNormalization: axis --------------------------------------------------------------------------------

@pytest.mark.parametrize("axis, shape", [(-1, (2, 4)), (1, (2, 4)), ([-2, -1], (2, 3, 4)), ([-1, -2], (2, 3, 4)),
                                         ((1, 2), (2, 3, 4)), ([2, -2], (2, 3, 4))])
def test_layernorm_axis_after_build_is_keras_sorted_list(axis, shape):
    ours, theirs = layers.LayerNormalization(axis=axis), keras.layers.LayerNormalization(axis=axis)
    ours.build(shape)
    theirs.build(shape)
    assert ours.axis == theirs.axis and isinstance(ours.axis, list)
    assert ours.get_config()["axis"] == theirs.get_config()["axis"]
    twin = layers.LayerNormalization.from_config(ours.get_config())  # the built config builds again
    twin.build(shape)
    assert twin.axis == ours.axis


@pytest.mark.parametrize("axis, shape", [([-1, 1], (2, 4)), ([1, 1], (2, 4)), ((-1, 2), (2, 3, 4))])
def test_layernorm_duplicate_axes_are_a_value_error(axis, shape):
    # Keras 3 fails too, later: its torch backend's RuntimeError "dim 1 appears multiple times" at call
    theirs = keras.layers.LayerNormalization(axis=axis)
    with pytest.raises(Exception, match="multiple times|[Dd]uplicate"):
        theirs(np.ones(shape, "float32"))
    with pytest.raises(ValueError, match="Duplicate axes"):
        layers.LayerNormalization(axis=axis).build(shape)
    with pytest.raises(ValueError, match="Duplicate axes"):
        layers.LayerNormalization(axis=axis)(np.ones(shape, "float32"))
    with pytest.raises(ValueError, match="Duplicate axes"):
        layers.LayerNormalization(axis=axis).compute_output_shape(shape)


@pytest.mark.parametrize("axis", [99, -3, [1, 5]])
def test_layernorm_out_of_range_axis_is_keras_value_error(axis):
    with pytest.raises(ValueError, match="out of bounds") as theirs:
        keras.layers.LayerNormalization(axis=axis).compute_output_shape((2, 4))
    with pytest.raises(ValueError, match="out of bounds") as ours:
        layers.LayerNormalization(axis=axis).compute_output_shape((2, 4))
    # Keras' sentence after the layer's name
    assert str(theirs.value) in str(ours.value)
    # Keras' build fails with an IndexError (a tuple index); attnx's with the same ValueError
    with pytest.raises(ValueError, match="out of bounds"):
        layers.LayerNormalization(axis=axis).build((2, 4))
    with pytest.raises(ValueError, match="out of bounds"):
        layers.LayerNormalization(axis=axis)(np.ones((2, 4), "float32"))


# ---- MultiHeadAttention: attention_axes, use_gate ------------------------------------------------------------

def _keras_mha_run(layer, query, value, key, dy, dscores):
    """Keras' outputs and scores, and the gradients of sum(out * dy) + sum(scores * dscores) for its inputs
    and trainable weights (torch autograd)."""
    xs = [None if x is None else torch.tensor(x, requires_grad=True) for x in (query, value, key)]
    out, scores = layer(xs[0], xs[1], key=xs[2], return_attention_scores=True)
    ((out * torch.tensor(dy)).sum() + (scores * torch.tensor(dscores)).sum()).backward()
    return (out.detach().numpy(), scores.detach().numpy(), [None if x is None else x.grad.numpy() for x in xs],
            [w.value.grad.numpy() for w in layer.trainable_weights])


_AXES_CASES = [  # query shape, value shape, attention_axes
    ((2, 3, 4, 5), (2, 3, 6, 5), (2,)),
    ((2, 3, 4, 5), (2, 3, 6, 5), -2),  # counted from the end of the input, as Keras: axis 2
    ((2, 3, 4, 5), (2, 6, 4, 5), [1]),
    ((2, 3, 4, 5), (2, 2, 6, 5), None),  # every axis between batch and features: over (3 * 4) x (2 * 6)
    ((2, 2, 3, 2, 4), (2, 3, 3, 5, 4), (1, 3)),
    ((2, 5, 4), (2, 7, 4), (1,)),
]


@pytest.mark.parametrize("use_gate", [False, True])
@pytest.mark.parametrize("with_key", [False, True])
@pytest.mark.parametrize("query_shape, value_shape, attention_axes", _AXES_CASES)
def test_mha_attention_axes_and_gate_match_keras(query_shape, value_shape, attention_axes, with_key, use_gate):
    rng = np.random.default_rng(1)
    query = rng.standard_normal(query_shape).astype("float32")
    value = rng.standard_normal(value_shape).astype("float32")
    key = rng.standard_normal(value_shape[:-1] + (3,)).astype("float32") if with_key else None
    theirs = keras.layers.MultiHeadAttention(2, 3, value_dim=4, attention_axes=attention_axes, use_gate=use_gate,
                                             bias_initializer="glorot_uniform")
    ours = layers.MultiHeadAttention(2, 3, value_dim=4, attention_axes=attention_axes, use_gate=use_gate)
    args = [query, value] + ([key] if with_key else [])
    theirs(query, value, key=key)
    ours(*args)
    assert [w.shape for w in ours.get_weights()] == [tuple(w.shape) for w in theirs.get_weights()]
    ours.set_weights([np.asarray(w) for w in theirs.get_weights()])
    out, scores = ours(*args, return_attention_scores=True)
    dy, dscores = rng.standard_normal(out.shape).astype("float32"), rng.standard_normal(scores.shape).astype("float32")
    y_k, s_k, dx_k, dw_k = _keras_mha_run(theirs, query, value, key, dy, dscores)
    assert out.shape == y_k.shape and scores.shape == s_k.shape
    _close(out, y_k)
    _close(scores, s_k)
    assert ours.compute_output_shape(*[x.shape for x in args], return_attention_scores=True) == \
        [out.shape, scores.shape]
    ours.zero_grad()
    (out_t, scores_t), cache = ours.apply(*args, training=True, return_attention_scores=True)
    _close(out_t, y_k)
    dxs = ours.backprop(cache, (dy, dscores))
    for a, k in zip(dxs, [g for g in dx_k if g is not None]):
        _close(a, k, atol=1e-4)
    for (name, _, g), k in zip(ours.trainable_params, dw_k):
        _close(g, k, atol=1e-4)


@pytest.mark.parametrize("query_shape, value_shape, attention_axes", _AXES_CASES[::2])
def test_mha_attention_axes_and_gate_gradients_float64(query_shape, value_shape, attention_axes):
    rng = np.random.default_rng(2)
    layer = layers.MultiHeadAttention(2, 2, value_dim=3, attention_axes=attention_axes, use_gate=True,
                                      bias_initializer="glorot_uniform", dtype="float64")
    gradcheck(layer, [rng.standard_normal(query_shape), rng.standard_normal(value_shape)],
              call_kwargs={"return_attention_scores": True})


def test_mha_attention_axes_symbolic_and_config():
    import attnx
    q, v = attnx.Input((3, 4, 5)), attnx.Input((3, 6, 5))
    mha = layers.MultiHeadAttention(2, 3, attention_axes=(2,), use_gate=True)
    out = mha(q, v)
    assert tuple(out.shape) == (None, 3, 4, 5)
    model = attnx.Model([q, v], out)
    rng = np.random.default_rng(0)
    x = [rng.standard_normal((2, 3, 4, 5)).astype("float32"), rng.standard_normal((2, 3, 6, 5)).astype("float32")]
    np.testing.assert_allclose(model.predict(x, verbose=0), mha(*x), rtol=1e-6)
    twin = layers.MultiHeadAttention.from_config(mha.get_config())
    assert twin.get_config() == mha.get_config()
    assert twin.attention_axes == (2,) and twin.use_gate


@pytest.mark.parametrize("bad", ["x", 1.5, True, [1, "a"], []])
def test_mha_attention_axes_type_error_as_keras(bad):
    with pytest.raises(ValueError, match="`attention_axes` must be an int, list, or tuple"):
        keras.layers.MultiHeadAttention(2, 3, attention_axes="x")
    with pytest.raises(ValueError, match="`attention_axes` must be an int, list, or tuple"):
        layers.MultiHeadAttention(2, 3, attention_axes=bad)


@pytest.mark.parametrize("axes", [(0,), (3,), (1, 1), (-4,), (-1,)])
def test_mha_attention_axes_out_of_range(axes):
    mha = layers.MultiHeadAttention(2, 3, attention_axes=axes)
    with pytest.raises(ValueError, match="attention_axes"):
        mha(np.zeros((2, 3, 4, 5), "float32"), np.zeros((2, 3, 4, 5), "float32"))


def test_mha_attention_axes_refuse_masks_and_mismatched_batch_axes():
    mha = layers.MultiHeadAttention(2, 3, attention_axes=(2,))
    q, v = np.zeros((2, 3, 4, 5), "float32"), np.zeros((2, 3, 6, 5), "float32")
    with pytest.raises(ValueError, match="without masks"):
        mha(q, v, use_causal_mask=True)
    with pytest.raises(ValueError, match="without masks"):
        mha(q, v, attention_mask=np.ones((2, 4, 6), bool))
    with pytest.raises(ValueError, match="share the sizes of the axes"):
        mha(q, np.zeros((2, 2, 6, 5), "float32"))
    with pytest.raises(ValueError, match="one rank above 3"):
        mha(q, np.zeros((2, 6, 5), "float32"))


# ---- MultiHeadAttention: regularizers and constraints --------------------------------------------------------

def test_mha_regularizers_match_keras():
    rng = np.random.default_rng(3)
    q, v = rng.standard_normal((2, 4, 5)).astype("float32"), rng.standard_normal((2, 6, 5)).astype("float32")
    theirs = keras.layers.MultiHeadAttention(2, 3, use_gate=True, kernel_regularizer=keras.regularizers.L2(0.01),
                                             bias_regularizer=keras.regularizers.L1(0.02),
                                             bias_initializer="glorot_uniform")
    ours = layers.MultiHeadAttention(2, 3, use_gate=True, kernel_regularizer=regularizers.L2(0.01),
                                     bias_regularizer=regularizers.L1(0.02))
    theirs(q, v)
    ours(q, v)
    ours.set_weights([np.asarray(w) for w in theirs.get_weights()])
    assert len(ours.losses) == len(theirs.losses) == 10
    _close(sum(ours.losses), float(sum(loss.detach() for loss in theirs.losses)), rtol=1e-5)
    # the penalty's gradient reaches the weights' buffers
    ours.zero_grad()
    ours.add_regularization_grads()
    np.testing.assert_allclose(ours.grads["query_kernel"], 0.02 * ours.params["query_kernel"], rtol=1e-6)


def test_mha_constraints_match_keras_after_an_optimizer_step():
    import attnx
    rng = np.random.default_rng(4)
    q, v = rng.standard_normal((4, 3, 5)).astype("float32"), rng.standard_normal((4, 6, 5)).astype("float32")
    y = rng.standard_normal((4, 3, 5)).astype("float32")

    def build(lib, mha):
        qi, vi = lib.Input((3, 5)), lib.Input((6, 5))
        model = lib.Model([qi, vi], mha(qi, vi))
        model.compile(optimizer=lib.optimizers.SGD(learning_rate=0.5), loss="mse")
        return model

    theirs = build(keras, keras.layers.MultiHeadAttention(2, 3, kernel_constraint=keras.constraints.MaxNorm(0.3),
                                                          bias_constraint=keras.constraints.NonNeg()))
    ours = build(attnx, layers.MultiHeadAttention(2, 3, kernel_constraint=constraints.MaxNorm(0.3),
                                                  bias_constraint="non_neg"))
    ours.set_weights([np.asarray(w) for w in theirs.get_weights()])
    theirs.fit([q, v], y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    ours.fit([q, v], y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    for a, k in zip(ours.get_weights(), theirs.get_weights()):
        _close(a, np.asarray(k), atol=1e-5)
    mha = ours.layers[-1]
    assert np.all(mha.params["query_bias"] >= 0)
    assert np.all(np.sqrt((mha.params["query_kernel"] ** 2).sum(axis=0)) <= 0.3 + 1e-6)


@pytest.mark.parametrize("constraint", [constraints.MaxNorm(1.5, axis=1), constraints.MinMaxNorm(0.5, 1.0, 0.7),
                                        constraints.NonNeg(), constraints.UnitNorm(axis=[0, 1])])
def test_constraints_match_keras(constraint):
    w = np.random.default_rng(5).standard_normal((4, 3, 2)).astype("float32")
    theirs = getattr(keras.constraints, type(constraint).__name__)(**constraint.get_config())
    _close(constraint(w), theirs(torch.tensor(w)).numpy(), atol=1e-6)
    assert constraints.get(constraints.serialize(constraint)).get_config() == constraint.get_config()


def test_constraint_errors_name_the_choices():
    with pytest.raises(ValueError, match="Unknown constraint 'max'.*MaxNorm"):
        layers.MultiHeadAttention(2, 3, kernel_constraint="max")


@pytest.mark.parametrize("kwargs", [{"use_gate": True, "attention_axes": (2,)},
                                    {"kernel_regularizer": "l2", "bias_constraint": "non_neg",
                                     "kernel_constraint": {"class_name": "MaxNorm", "config": {"max_value": 3.0}}}])
def test_mha_new_arguments_round_trip_keras_files(tmp_path, kwargs):
    import attnx
    from attnx import interop
    shape_q, shape_v = ((3, 4, 5), (3, 6, 5)) if "attention_axes" in kwargs else ((4, 5), (6, 5))
    qi, vi = attnx.Input(shape_q), attnx.Input(shape_v)
    model = attnx.Model([qi, vi], layers.MultiHeadAttention(2, 3, **kwargs)(qi, vi))
    rng = np.random.default_rng(6)
    x = [rng.standard_normal((2,) + shape_q).astype("float32"), rng.standard_normal((2,) + shape_v).astype("float32")]
    kmodel = interop.to_keras(model)
    _close(kmodel.predict(x, verbose=0), model.predict(x, verbose=0))
    kconfig = kmodel.layers[-1].get_config()
    for arg in kwargs:
        assert kconfig[arg] is not None
    path = tmp_path / "m.keras"
    kmodel.save(path)
    back = interop.from_keras(str(path))
    _close(back.predict(x, verbose=0), model.predict(x, verbose=0))
    assert back.layers[-1].get_config()["use_gate"] == model.layers[-1].use_gate


def test_mha_gate_exports_to_onnx_and_other_axes_are_refused(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    import attnx
    from attnx import export, interop
    q, v = attnx.Input((4, 5)), attnx.Input((6, 5))
    model = attnx.Model([q, v], layers.MultiHeadAttention(2, 3, use_gate=True, bias_initializer="ones")(q, v))
    rng = np.random.default_rng(7)
    x = [rng.standard_normal((2, 4, 5)).astype("float32"), rng.standard_normal((2, 6, 5)).astype("float32")]
    path = export.to_onnx(model, tmp_path / "m.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], x)))
    _close(got, model.predict(x, verbose=0), atol=1e-5)
    q4, v4 = attnx.Input((3, 4, 5)), attnx.Input((3, 6, 5))
    high = attnx.Model([q4, v4], layers.MultiHeadAttention(2, 3, attention_axes=(2,))(q4, v4))
    with pytest.raises(export.UnsupportedLayerError, match="inputs of rank 4"):
        export.to_onnx(high, tmp_path / "h.onnx")
    with pytest.raises(ValueError, match="use_gate=True"):
        interop.to_torch(_built_gate())


def _built_gate():
    layer = layers.MultiHeadAttention(2, 3, use_gate=True)
    layer(np.zeros((1, 2, 6), "float32"), np.zeros((1, 2, 6), "float32"))
    return layer
