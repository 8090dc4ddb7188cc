"""No per-call state on shared objects (issue 38): a backward pass takes `need_dx` as an argument, a
GradientTape's gradients live on the tape (two threads taking gradients of one model get the serial
gradients), and the tape's memo of repeated calls compares values, not only the arrays' identity."""
import threading

import numpy as np
import attnx
from attnx import layers, ops as K

THREADS = 2
ROUNDS = 40


def _model(seed=3):
    attnx.set_random_seed(seed)
    inp = attnx.Input((7,), dtype="int64")
    x = layers.Embedding(30, 8, mask_zero=True)(inp)
    x = layers.Bidirectional(layers.GRU(6, return_sequences=True))(x)
    x = layers.AttentionPooling()(x)
    out = layers.Dense(3, activation="softmax")(layers.Dense(5, activation="tanh")(x))
    model = attnx.Model(inp, out)
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def _batch(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 30, (4, 7))
    x[:, 5:] = 0
    return x, rng.integers(0, 3, 4)


def _tape_gradients(model, x, y):
    with attnx.GradientTape() as tape:
        loss = model.compute_loss(y=y, y_pred=model(x, training=True))
    return tape.gradient(loss, model.trainable_variables)


def test_two_threads_taking_tape_gradients_of_one_model_equal_the_serial_gradients():
    model = _model()
    batches = [_batch(seed) for seed in range(ROUNDS)]
    serial = [_tape_gradients(model, x, y) for x, y in batches]
    before = {name: g.copy() for name, g in model.grads.items()}
    results, errors = [None] * (THREADS * ROUNDS), []
    barrier = threading.Barrier(THREADS)

    def work(start):
        try:
            barrier.wait()
            for i in range(start, ROUNDS, THREADS):
                results[i] = _tape_gradients(model, *batches[i])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "thread hung"
    if errors:
        raise errors[0]
    wrong = [(i, j) for i in range(ROUNDS) for j, (got, want) in enumerate(zip(results[i], serial[i]))
             if not np.array_equal(got, want)]
    assert not wrong, f"{len(wrong)} of {ROUNDS * len(serial[0])} gradients differ from the serial ones"
    # the tape neither zeroed nor added into the layers' own buffers
    for name, g in model.grads.items():
        np.testing.assert_array_equal(g, before[name], err_msg=name)


def test_tape_gradients_leave_the_layers_grads_buffers_alone():
    model = _model()
    for name, g in model.grads.items():
        g.fill(7.0)
    grads = _tape_gradients(model, *_batch(0))
    assert all(np.all(g == 7.0) for g in model.grads.values())
    assert any(np.any(g != 0) for g in grads)
    assert not any(np.shares_memory(g, b) for g in grads for b in model.grads.values())


def test_the_tape_memo_sees_an_array_changed_in_place():
    dense = layers.Dense(3, use_bias=False)
    x = np.ones((2, 4), dtype="float32")
    dense(x)
    with attnx.GradientTape():
        first = dense(x)
        x[...] = 2.0  # the same array, other values: another call
        second = dense(x)
    assert second is not first
    np.testing.assert_allclose(K.untraced(second), 2 * K.untraced(first), rtol=1e-6)


def test_the_tape_memo_still_records_a_repeated_call_once():
    dense = layers.Dense(3)
    x = np.ones((2, 4), dtype="float32")
    dense(x)
    with attnx.GradientTape():
        first, second = dense(x), dense(x)
    assert first is second


class _OldStyle(layers.Layer):
    """A layer of yours written before `need_dx`: backprop(cache, dy)."""

    def build(self, input_shape):
        self.w = self.add_weight("w", (input_shape[-1],), "ones")

    def forward(self, inputs, training=False):
        return inputs * self.w, (inputs if training else None)

    def backprop(self, cache, dy):
        self.grads["w"] += np.sum(dy * cache, axis=0)
        return dy * self.w


def test_a_layer_whose_backprop_takes_no_need_dx_still_trains_in_a_model():
    inp = attnx.Input((4,))
    hidden = _OldStyle()(inp)
    model = attnx.Model(inp, layers.Dense(1)(hidden))
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).standard_normal((8, 4)).astype("float32")
    old_style = next(layer for layer in model.layers if isinstance(layer, _OldStyle))
    before = old_style.params["w"].copy()
    model.fit(x, np.ones((8, 1), "float32"), epochs=2, verbose=0)
    assert not np.array_equal(old_style.params["w"], before)


def test_no_layer_keeps_an_input_gradient_flag():
    import pathlib
    root = pathlib.Path(attnx.__file__).parent
    found = [str(p.relative_to(root)) for p in root.rglob("*.py") if "input_gradient_needed" in p.read_text()]
    assert not found, f"per-call state set on layers: input_gradient_needed in {found}"
