"""Bad input: every case raises a clear Python exception naming the layer and the expected and
actual shapes; non-contiguous and read-only arrays just work; nothing crashes."""
import re

import numpy as np
import pytest

import attnx
from attnx import _core, layers

f32 = np.float32


def built_dense(name="dense_bad", units=4, features=3):
    layer = layers.Dense(units, name=name)
    layer(np.zeros((1, features), f32))
    return layer


def embedding(name="emb_bad"):
    layer = layers.Embedding(10, 4, name=name)
    layer(np.array([[1]]))
    return layer


# ------------------------------------------------------------------------- shapes
def test_dense_wrong_rank():
    layer = built_dense()
    with pytest.raises(ValueError, match=r"dense_bad.*rank >= 2.*got shape \(3,\)"):
        layer(np.zeros(3, f32))
    with pytest.raises(ValueError, match=r"dense_bad.*got shape \(\)"):
        layer(np.float32(1.0))


def test_dense_wrong_feature_size():
    layer = built_dense()
    with pytest.raises(ValueError, match=r"dense_bad.*\(\.\.\., 3\).*got shape \(2, 5\)"):
        layer(np.zeros((2, 5), f32))
    with pytest.raises(ValueError, match=r"dense_bad.*got shape \(2, 7, 2\)"):
        layer(np.zeros((2, 7, 2), f32))


def test_other_layers_wrong_shape():
    gap = layers.GlobalAveragePooling1D(name="gap_bad")
    with pytest.raises(ValueError, match=r"gap_bad.*rank 3.*got shape \(2, 3\)"):
        gap(np.zeros((2, 3), f32))
    with pytest.raises(ValueError, match=r"gap_bad.*mask.*expected a mask of shape \(2, 5\).*got shape \(2, 4\)"):
        gap(np.zeros((2, 5, 3), f32), mask=np.ones((2, 4), bool))
    cat = layers.Concatenate(name="cat_bad")
    with pytest.raises(ValueError, match=r"cat_bad.*\(2, 3, 4\), \(2, 5, 4\)"):
        cat([np.zeros((2, 3, 4), f32), np.zeros((2, 5, 4), f32)])
    with pytest.raises(ValueError, match="cat_bad.*list of at least 2"):
        cat(np.zeros((2, 3), f32))
    add = layers.Add(name="add_bad")
    with pytest.raises(ValueError, match=r"add_bad.*\(2, 3\), \(2, 1\)"):  # no broadcasting
        add([np.zeros((2, 3), f32), np.zeros((2, 1), f32)])
    reshape = layers.Reshape((4, 2), name="reshape_bad")
    with pytest.raises(ValueError, match=r"reshape_bad.*\(3, 3\) to \(4, 2\)"):
        reshape(np.zeros((2, 3, 3), f32))
    drop = layers.Dropout(0.5, noise_shape=(None, 1), name="drop_bad")
    with pytest.raises(ValueError, match="drop_bad.*noise_shape"):
        drop(np.zeros((2, 3, 4), f32), training=True)


def test_model_wrong_input_rank_and_count():
    inp = attnx.Input(shape=(3,), name="feats_in")
    model = attnx.Model(inp, layers.Dense(2, name="head_bad")(inp))
    with pytest.raises(ValueError, match=r"feats_in.*rank 2.*got shape \(3,\)"):
        model.predict(np.zeros(3, f32))
    with pytest.raises(ValueError, match=r"head_bad.*\(\.\.\., 3\).*got shape \(4, 5\)"):
        model.predict(np.zeros((4, 5), f32))
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="different numbers of samples"):
        model.fit(np.zeros((4, 3), f32), np.zeros((5, 2), f32), verbose=0)


# ------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("bad", [np.ones((2, 3), bool), np.array([[1, 2, 3]], dtype=object),
                                 np.array([["a", "b", "c"]]), np.ones((2, 3), np.complex64)],
                         ids=["bool", "object", "str", "complex"])
def test_wrong_dtype(bad):
    with pytest.raises(TypeError, match=rf"dense_bad.*dtype {re.escape(str(bad.dtype))}"):
        built_dense()(bad)
    with pytest.raises(TypeError, match="emb_bad"):
        embedding()(bad)
    with pytest.raises(TypeError, match="act_bad"):
        layers.Activation("relu", name="act_bad")(bad)


def test_integer_inputs_are_converted():
    layer = built_dense()
    assert np.array_equal(layer(np.ones((2, 3), np.int32)), layer(np.ones((2, 3), f32)))


def test_embedding_non_integer_ids():
    with pytest.raises(TypeError, match="emb_bad.*integers"):
        embedding()(np.array([[1.5, 2.0]]))
    with pytest.raises(TypeError, match="emb_bad.*integers"):
        embedding()(np.array([[np.nan, 2.0]]))
    assert np.array_equal(embedding("emb_ok")(np.array([[1.0, 2.0]])).shape, (1, 2, 4))


# ------------------------------------------------------------------------- indices
def test_token_index_out_of_range():
    layer = embedding()
    with pytest.raises(IndexError, match=r"emb_bad.*token id 10 out of range \[0, 10\)"):
        layer(np.array([[1, 10]]))
    with pytest.raises(IndexError, match=r"emb_bad.*token id -1"):
        layer(np.array([[-1, 3]]))
    with pytest.raises(IndexError, match="emb_bad"):
        layer(np.array([[2 ** 40]], dtype=np.int64))
    with pytest.raises(IndexError, match="emb_bad"):
        layer(np.array([[255]], dtype=np.uint8))


# ------------------------------------------------------------------------- empty batch
@pytest.mark.parametrize("make,x", [
    (lambda: built_dense(), np.zeros((0, 3), f32)),
    (lambda: embedding(), np.zeros((0, 5), np.int64)),
    (lambda: layers.Activation("tanh", name="act_bad"), np.zeros((0, 3), f32)),
    (lambda: layers.GlobalAveragePooling1D(name="gap_bad"), np.zeros((0, 4, 2), f32)),
    (lambda: layers.Flatten(name="flat_bad"), np.zeros((0, 4, 2), f32)),
    (lambda: layers.Dropout(0.3, name="drop_bad"), np.zeros((0, 4), f32)),
], ids=["dense", "embedding", "activation", "gap", "flatten", "dropout"])
def test_empty_batch(make, x):
    layer = make()
    with pytest.raises(ValueError, match=rf"{layer.name}.*empty batch.*{re.escape(str(x.shape))}"):
        layer(x)


def test_empty_batch_model():
    model = attnx.Sequential([layers.Dense(2, input_shape=(3,))])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="empty batch|no samples"):
        model.fit(np.zeros((0, 3), f32), np.zeros((0, 2), f32), verbose=0)
    with pytest.raises(ValueError, match="empty batch|no samples"):
        model.predict(np.zeros((0, 3), f32))
    with pytest.raises(ValueError, match="empty"):
        attnx.losses.mse(np.zeros((0, 2), f32), np.zeros((0, 2), f32))


# ------------------------------------------------------------------------- layouts
def test_non_contiguous_and_read_only_inputs_match():
    rng = np.random.default_rng(0)
    layer = built_dense(features=6)
    base = rng.standard_normal((8, 6)).astype(f32)
    expected = layer(base)
    transposed = np.asfortranarray(base)
    strided = np.repeat(base, 2, axis=0)[::2]
    wide = np.zeros((8, 12), f32)
    wide[:, ::2] = base
    readonly = base.copy()
    readonly.flags.writeable = False
    as_f64 = base.astype(np.float64)
    for x in (transposed, strided, wide[:, ::2], readonly, as_f64):
        assert np.array_equal(layer(x), expected)
    layer(wide[:, ::2], training=True)
    dy = np.ones((16, 4), f32)[::2]
    dy.flags.writeable = False
    layer.zero_grad()
    dx = layer.backward(dy)
    g = layer.grads["kernel"].copy()
    layer.zero_grad()
    layer(base, training=True)
    assert np.array_equal(layer.backward(np.ones((8, 4), f32)), dx)
    assert np.array_equal(layer.grads["kernel"], g)

    emb = embedding()
    ids = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    ro = ids.copy()
    ro.flags.writeable = False
    for variant in (ids.T.copy().T, np.asfortranarray(ids), ro, np.repeat(ids, 2, axis=1)[:, ::2]):
        assert np.array_equal(emb(variant), emb(ids))

    gap = layers.GlobalAveragePooling1D()
    x3 = rng.standard_normal((4, 5, 3)).astype(f32)
    mask = np.ones((4, 5), bool)
    mask[:, 3:] = False
    mask_ro = np.asfortranarray(mask)
    mask_ro.flags.writeable = False
    assert np.array_equal(gap(np.asfortranarray(x3), mask=mask_ro), gap(x3, mask=mask))

    model = attnx.Sequential([layers.Dense(3, input_shape=(6,)), layers.Activation("softmax")])
    assert np.array_equal(model.predict(transposed), model.predict(base))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    labels_ro = labels.copy()
    labels_ro.flags.writeable = False
    model.fit(transposed, labels_ro, epochs=1, verbose=0)  # works; and the inputs are untouched
    assert np.array_equal(transposed, base)


# ------------------------------------------------------------------------- backward misuse
@pytest.mark.parametrize("make,x", [
    (lambda: built_dense(), np.zeros((2, 3), f32)),
    (lambda: embedding(), np.array([[1, 2]])),
    (lambda: layers.Activation("gelu", name="act_bad"), np.zeros((2, 3), f32)),
    (lambda: layers.Dropout(0.5, name="drop_bad"), np.zeros((2, 3), f32)),
    (lambda: layers.Flatten(name="flat_bad"), np.zeros((2, 3, 2), f32)),
    (lambda: layers.Reshape((3, 2), name="reshape_bad"), np.zeros((2, 6), f32)),
    (lambda: layers.GlobalAveragePooling1D(name="gap_bad"), np.zeros((2, 3, 2), f32)),
], ids=["dense", "embedding", "activation", "dropout", "flatten", "reshape", "gap"])
def test_backward_before_training_forward(make, x):
    layer = make()
    with pytest.raises(RuntimeError, match=rf"{layer.name}.*training=True"):
        layer.backward(np.zeros((2, 4), f32))
    y = layer(x, training=True)
    first = layer.backward(np.ones(np.shape(y), f32))
    layer(x)  # an inference call leaves the last training call alone (state belongs to calls)
    again = layer.backward(np.ones(np.shape(y), f32))
    if first is not None:
        np.testing.assert_array_equal(first, again)


def test_backward_before_forward_merge_and_model():
    for layer in (layers.Concatenate(name="cat_bad"), layers.Add(name="add_bad")):
        with pytest.raises(RuntimeError, match=layer.name):
            layer.backward(np.zeros((2, 3), f32))
    model = attnx.Sequential([layers.Dense(2, input_shape=(3,))], name="seq_bad")
    with pytest.raises(RuntimeError, match="seq_bad.*training=True"):
        model.backward(np.zeros((1, 2), f32))


@pytest.mark.parametrize("make,x,bad_dy", [
    (lambda: built_dense(), np.zeros((2, 3), f32), np.zeros((2, 5), f32)),
    (lambda: embedding(), np.array([[1, 2]]), np.zeros((1, 3, 4), f32)),
    (lambda: layers.Activation("tanh", name="act_bad"), np.zeros((2, 3), f32), np.zeros((2, 1), f32)),
    (lambda: layers.Dropout(0.5, name="drop_bad"), np.zeros((2, 3), f32), np.zeros((2, 1), f32)),
    (lambda: layers.Dropout(0.0, name="drop_bad"), np.zeros((2, 3), f32), np.zeros((1, 3), f32)),
    (lambda: layers.Flatten(name="flat_bad"), np.zeros((2, 3, 2), f32), np.zeros((2, 5), f32)),
    (lambda: layers.Reshape((3, 2), name="reshape_bad"), np.zeros((2, 6), f32), np.zeros((2, 2, 3), f32)),
    (lambda: layers.GlobalAveragePooling1D(name="gap_bad"), np.zeros((2, 3, 2), f32), np.zeros((2, 3), f32)),
    (lambda: layers.Concatenate(name="cat_bad"), [np.zeros((2, 3), f32), np.zeros((2, 2), f32)],
     np.zeros((2, 6), f32)),
    (lambda: layers.Add(name="add_bad"), [np.zeros((2, 3), f32), np.zeros((2, 3), f32)], np.zeros((2, 1), f32)),
], ids=["dense", "embedding", "activation", "dropout", "dropout0", "flatten", "reshape", "gap", "concat", "add"])
def test_backward_wrong_dy_shape(make, x, bad_dy):
    layer = make()
    y = layer(x, training=True)
    with pytest.raises(ValueError, match=rf"{layer.name}.*expected shape {re.escape(str(np.shape(y)))}, "
                                         rf"got {re.escape(str(bad_dy.shape))}"):
        layer.backward(bad_dy)


def test_model_backward_wrong_number_of_gradients():
    a, b = attnx.Input(shape=(2,)), attnx.Input(shape=(2,))
    model = attnx.Model([a, b], [layers.Dense(1)(a), layers.Dense(1)(b)], name="two_out")
    model([np.zeros((1, 2), f32)] * 2, training=True)
    with pytest.raises(ValueError, match="two_out.*2 output gradients, got 1"):
        model.backward([np.zeros((1, 1), f32)])


# ------------------------------------------------------------------------- model files
def test_corrupted_model_file(tmp_path):
    model = attnx.Sequential([layers.Dense(2, input_shape=(3,))])
    path = tmp_path / "m.attnx"
    model.save(path)
    raw = path.read_bytes()
    (tmp_path / "t.attnx").write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.raises(ValueError, match="t.attnx.*truncated or corrupted"):
        attnx.load_model(tmp_path / "t.attnx")
    (tmp_path / "z.attnx").write_bytes(b"\x00" * len(raw))
    with pytest.raises(ValueError, match="truncated or corrupted"):
        attnx.load_model(tmp_path / "z.attnx")


# ------------------------------------------------------------------------- _core directly
X = np.ones((2, 3), f32)
K = np.ones((3, 4), f32)
B = np.zeros(4, f32)


def _ro(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _core_cases():
    y, z = _core.dense_forward(X, K, B, "linear")
    dk, db = np.zeros_like(K), np.zeros_like(B)
    table, dtable = np.ones((5, 2), f32), np.zeros((5, 2), f32)
    P, G = [np.ones(3, f32)], [np.ones(3, f32)]
    return [
        (TypeError, "float32 or float64", lambda: _core.dense_forward(X.astype(int), K, B, "linear")),
        (TypeError, "kernel: expected dtype float64", lambda: _core.dense_forward(X.astype(float), K, B, "linear")),
        (TypeError, "bias: expected dtype float32", lambda: _core.dense_forward(X, K, B.astype(float), "linear")),
        (ValueError, r"kernel: expected shape \(3, \*\), got \(4, 4\)",
         lambda: _core.dense_forward(X, np.ones((4, 4), f32), B, "linear")),
        (ValueError, r"x: expected rank 2, got shape \(3,\)", lambda: _core.dense_forward(X[0], K, B, "linear")),
        (ValueError, "C-contiguous", lambda: _core.dense_forward(np.ones((3, 2), f32).T, K, B, "linear")),
        (ValueError, "unknown activation", lambda: _core.dense_forward(X, K, B, "swish")),
        (TypeError, "incompatible", lambda: _core.dense_forward(None, K, B, "linear")),
        (ValueError, r"dy: expected shape \(2, 4\), got \(2, 5\)",
         lambda: _core.dense_backward(np.ones((2, 5), f32), X, K, y, z, "linear", dk, db)),
        (ValueError, r"kernel: expected rank 2, got shape \(3,\)",
         lambda: _core.dense_backward(y, X, np.ones(3, f32), y, z, "linear", dk, db)),
        (ValueError, "dkernel: array is read-only", lambda: _core.dense_backward(y, X, K, y, z, "linear", _ro(dk), db)),
        (ValueError, "dbias: array is read-only", lambda: _core.dense_backward(y, X, K, y, z, "linear", dk, _ro(db))),
        (TypeError, "dkernel: expected dtype float32",
         lambda: _core.dense_backward(y, X, K, y, z, "linear", dk.astype(float), db)),
        (TypeError, "float32 or float64", lambda: _core.activation_forward(np.ones(3, np.float16), "relu")),
        (ValueError, r"expected shape \(2, 3\), got \(2, 4\)",
         lambda: _core.activation_backward(X, np.ones((2, 4), f32), X, "relu")),
        (TypeError, "int64", lambda: _core.embedding_forward(np.array([1], np.int32), table)),
        (IndexError, r"token id 5 out of range \[0, 5\)", lambda: _core.embedding_forward(np.array([5]), table)),
        (IndexError, "token id -1", lambda: _core.embedding_forward(np.array([-1]), table)),
        (ValueError, "read-only", lambda: _core.embedding_backward(_ro(dtable), np.ones((1, 2), f32), np.array([1]))),
        (ValueError, r"dout: expected shape \(1, 2\), got \(2, 2\)",
         lambda: _core.embedding_backward(dtable, np.ones((2, 2), f32), np.array([1]))),
        (IndexError, "out of range", lambda: _core.embedding_backward(dtable, np.ones((1, 2), f32), np.array([9]))),
        (ValueError, r"target: expected shape \(2, 3\), got \(2, 4\)",
         lambda: _core.binary_crossentropy(X, np.ones((2, 4), f32), None, True, 1.0)),
        (TypeError, "expected dtype float32", lambda: _core.mean_squared_error(X, X.astype(float), None, 1.0)),
        (ValueError, "normalizer must be positive", lambda: _core.mean_squared_error(X, X, None, 0.0)),
        (ValueError, "expected 6 weights", lambda: _core.mean_squared_error(X, X, np.ones(5, f32), 1.0)),
        (IndexError, r"label 3 out of range \[0, 3\)",
         lambda: _core.sparse_categorical_crossentropy(X, np.array([0, 3]), None, True, -100, 2.0)),
        (TypeError, "int64", lambda: _core.sparse_categorical_crossentropy(X, np.array([0, 1], np.int32), None, True,
                                                                            -100, 2.0)),
        (ValueError, "expected 2 labels", lambda: _core.sparse_categorical_crossentropy(X, np.array([0]), None, True,
                                                                                        -100, 2.0)),
        (ValueError, "class axis", lambda: _core.sparse_categorical_crossentropy(np.array(1.0, f32), np.array(0), None,
                                                                                 True, -100, 1.0)),
        (ValueError, "momentum buffers: expected 1 arrays, got 0",
         lambda: _core.sgd_update(P, G, [], 0.1, 0.9, False, 0.0)),
        (ValueError, r"buffer 0 has shape \(2,\)", lambda: _core.sgd_update(P, G, [np.ones(2, f32)], 0.1, 0.9, False, 0)),
        (ValueError, "params: array is read-only",
         lambda: _core.sgd_update([_ro(P[0])], G, [np.ones(3, f32)], 0.1, 0.0, False, 0.0)),
        (TypeError, "grads: expected dtype float32", lambda: _core.sgd_update(P, [np.ones(3)], [np.ones(3, f32)],
                                                                              0.1, 0.0, False, 0.0)),
        (ValueError, "step must be >= 1", lambda: _core.adam_update(P, G, [np.ones(3, f32)], [np.ones(3, f32)], 0.1,
                                                                    0.9, 0.9, 1e-7, 0, 0.0, False)),
        (TypeError, "mean_grads", lambda: _core.rmsprop_update(P, G, [np.ones(3, f32)], 5, None, 0.1, 0.9, 1e-7,
                                                               0.0, 0.0)),
        (TypeError, "float32 or float64", lambda: _core.global_norm([np.ones(3, int)])),
        (ValueError, "read-only", lambda: _core.scale_([_ro(P[0])], 2.0)),
        (ValueError, "read-only", lambda: _core.clip_([_ro(P[0])], 0.0, 1.0)),
        (ValueError, "zero_: arrays: array is read-only", lambda: _core.zero_([P[0], _ro(G[0])])),
        (TypeError, "zero_: arrays: expected dtype float32", lambda: _core.zero_([P[0], np.ones(3)])),
        (TypeError, "float32 or float64", lambda: _core.zero_([np.ones(3, int)])),
        (TypeError, "l1l2_penalty: weights", lambda: _core.l1l2_penalty(np.ones(3, int), 0.0, 0.1)),
        (ValueError, r"l1l2_add_gradient: grad: expected shape \(3,\)",
         lambda: _core.l1l2_add_gradient(np.ones(2, f32), P[0], 0.0, 0.1)),
        (TypeError, "l1l2_add_gradient: grad", lambda: _core.l1l2_add_gradient(np.ones(3), P[0], 0.0, 0.1)),
        (ValueError, "read-only", lambda: _core.l1l2_add_gradient(_ro(G[0]), P[0], 0.0, 0.1)),
    ]


@pytest.mark.parametrize("index", range(len(_core_cases())))
def test_core_bad_arguments_raise(index):
    exc, pattern, call = _core_cases()[index]
    with pytest.raises(exc, match=pattern):
        call()


def test_core_bad_arguments_never_crash_subprocess():
    """The same calls in a fresh interpreter: it must exit normally (no segfault/abort)."""
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, %r); import tests.test_bad_input as t\n"
            "n = 0\n"
            "for exc, pattern, call in t._core_cases():\n"
            "    try:\n        call()\n    except Exception:\n        n += 1\n"
            "print(n)\n") % str(__import__("pathlib").Path(__file__).resolve().parents[1])
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(__import__("pathlib").Path(attnx.__file__).parents[1]),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) == len(_core_cases())


def test_losses_accept_any_layout():
    rng = np.random.default_rng(5)
    z = rng.standard_normal((6, 4)).astype(f32)
    labels = rng.integers(0, 4, 6)
    y = (rng.random((6, 4)) > 0.5).astype(f32)
    ro = z.copy()
    ro.flags.writeable = False
    for loss, target in ((attnx.losses.SparseCategoricalCrossentropy(from_logits=True), labels),
                         (attnx.losses.BinaryCrossentropy(from_logits=True), y),
                         (attnx.losses.MeanSquaredError(), y)):
        value, grad = loss.compute(target, z)
        for variant in (np.asfortranarray(z), np.repeat(z, 2, axis=0)[::2], ro):
            v2, g2 = loss.compute(np.asfortranarray(target) if target.ndim == 2 else target[::-1][::-1], variant)
            assert v2 == value and np.array_equal(g2, grad)


# ------------------------------------------------------------------------- attention inputs
@pytest.mark.parametrize("call", [lambda m: m(1.5, 2.5), lambda m: m([1.5, 2.5]), lambda m: m([[1.0, 2.0]] * 2),
                                  lambda m: m(1.5, np.ones((1, 2, 4), f32))],
                         ids=["floats", "list of floats", "lists", "float query"])
def test_fresh_multi_head_attention_given_non_arrays(call):
    """Not AttributeError / IndexError from building on shapes the inputs do not have."""
    with pytest.raises(ValueError, match=r"Layer 'mha_bad': query, value and key should be rank 3 "
                                         r"\(batch, time, features\), got shapes \[\("):
        call(layers.MultiHeadAttention(2, 4, name="mha_bad"))


ATTENTION_LAYERS = {
    "Attention": lambda: layers.Attention(), "general": lambda: layers.Attention(score="general"),
    "Additive": lambda: layers.BahdanauAdditiveAttention(), "Luong": lambda: layers.LuongAttention(),
    "Luong attentional": lambda: layers.LuongAttention(attentional_units=5),
    "Local": lambda: layers.LocalAttention(window=1), "MultiHeadAttention": lambda: layers.MultiHeadAttention(2, 4),
}


@pytest.mark.parametrize("lengths", [(0, 3), (3, 0), (0, 0)], ids=["Tq=0", "S=0", "both 0"])
@pytest.mark.parametrize("make", ATTENTION_LAYERS.values(), ids=ATTENTION_LAYERS.keys())
def test_zero_length_sequences_work_in_attention_layers(make, lengths):
    """A zero-length query gives an empty output; a zero-length value a zero context (every query
    fully masked); forward and backward, never a raw 'cannot reshape array of size 0'."""
    (Tq, S), layer = lengths, make()
    query, value = np.ones((2, Tq, 4), f32), np.ones((2, S, 4), f32)
    inputs = (query, value) if isinstance(layer, layers.MultiHeadAttention) else ([query, value],)
    y = layer(*inputs, training=True)
    assert y.shape[:2] == (2, Tq) and np.isfinite(y).all()
    grads = layer.backward(np.ones_like(y))
    assert grads[0].shape == query.shape and grads[1].shape == value.shape


def test_hard_attention_zero_length_value_names_the_layer():
    with pytest.raises(ValueError, match=r"Layer 'hard_bad': hard attention picks one of the value's positions; "
                                         r"got a value of length 0"):
        layers.HardAttention(name="hard_bad")([np.ones((2, 3, 4), f32), np.ones((2, 0, 4), f32)])


@pytest.mark.parametrize("decoder", ["BahdanauDecoder", "LuongDecoder"])
@pytest.mark.parametrize("state", [np.full((2, 4), None, object), np.full((2, 4), "a"), np.zeros((2, 4), "M8[s]"),
                                   np.zeros((2, 4), complex)], ids=["object", "str", "datetime", "complex"])
@pytest.mark.parametrize("which", [0, 1], ids=["h0", "c0"])
def test_decoders_refuse_non_numeric_states_as_lstm_does(decoder, state, which):
    from attnx import seq2seq
    dec = getattr(seq2seq, decoder)(vocab_size=7, embedding_dim=3, units=4, cell="lstm", name="dec_bad")
    states = [np.zeros((2, 4), f32), np.zeros((2, 4), f32)]
    states[which] = state
    with pytest.raises(TypeError, match=rf"Layer 'dec_bad': `initial_state\[{which}\]` must be a numeric array, "
                                        rf"got dtype {re.escape(str(state.dtype))}"):
        dec([np.ones((2, 3), np.int64), np.ones((2, 5, 4), f32)] + states)
    with pytest.raises(TypeError, match="must be a numeric array"):
        attnx.layers.LSTM(4)(np.ones((2, 3, 4), f32), initial_state=states)
