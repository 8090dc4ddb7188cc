"""Concurrent use from Python threads (the kernels release the GIL).

- Inference from several threads at once on one model gives the outputs of sequential calls (the
  forward pass keeps no shared scratch state): bit for bit for the MLP and RNN models below; for
  MultiHeadAttention and the Transformer encoder within float32 rounding (an adversarial run measured
  up to 7e-7 on 5/45 and 20/45 calls; ARCHITECTURE.md, "Threads and SIMD", says why).
- Training one model while other threads run inference on another (and two trainings side by
  side) gives exactly the results of running each alone.
- The kernels really release the GIL: a pure-Python thread keeps running while a long kernel
  call is in flight.
"""
import threading
import time

import numpy as np
import pytest

import attnx
from attnx import _core, layers

THREADS = 4


def _run_threads(fns):
    """Runs each fn in its own thread, all released at once; returns their results (re-raises)."""
    barrier = threading.Barrier(len(fns))
    results, errors = [None] * len(fns), []

    def target(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=target, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "thread hung"
    if errors:
        raise errors[0]
    return results


def _classifier(seed, vocab=50, T=12):
    attnx.set_random_seed(seed)
    inp = attnx.Input((T,), dtype="int64")
    x = layers.Embedding(vocab, 16, mask_zero=True)(inp)
    x = layers.Dense(32, activation="relu")(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(16, activation="gelu")(x)
    out = layers.Dense(3, activation="softmax")(x)
    model = attnx.Model(inp, out)
    model.compile(attnx.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    return model


def _recurrent(seed, T=7):
    attnx.set_random_seed(seed)
    model = attnx.Sequential([layers.LSTM(8, return_sequences=True, input_shape=(T, 5)),
                              layers.GRU(6), layers.Dense(2, activation="softmax")])
    model.compile("rmsprop", "sparse_categorical_crossentropy")
    return model


def _data(seed, n=96, vocab=50, T=12):
    r = np.random.default_rng(seed)
    return r.integers(0, vocab, size=(n, T)), r.integers(0, 3, size=n)


@pytest.mark.parametrize("make", [_classifier, _recurrent], ids=["mlp", "rnn"])
def test_parallel_inference_on_one_model_matches_sequential(make):
    model = make(0)
    r = np.random.default_rng(1)
    if make is _classifier:
        batches = [r.integers(0, 50, size=(int(b), 12)) for b in r.integers(1, 40, size=24)]
    else:
        batches = [r.normal(size=(int(b), 7, 5)).astype(np.float32) for b in r.integers(1, 40, size=24)]
    sequential = [model.predict(b, batch_size=16) for b in batches]
    for _ in range(3):
        per_thread = [batches[i::THREADS] for i in range(THREADS)]
        got = _run_threads([lambda bs=bs: [model.predict(b, batch_size=16) for b in bs] for bs in per_thread])
        for i, outs in enumerate(got):
            for out, want in zip(outs, sequential[i::THREADS]):
                np.testing.assert_array_equal(out, want)


# Threaded attention inference matches sequential inference to this tolerance, not bit for bit: the
# bound is 10x the largest difference measured (7e-7, outputs of magnitude ~1).
ATTENTION_RTOL, ATTENTION_ATOL = 1e-5, 7e-6


@pytest.mark.parametrize("make", [lambda: layers.MultiHeadAttention(4, 16),
                                  lambda: layers.TransformerEncoder(num_layers=2, num_heads=4, intermediate_dim=128)],
                         ids=["mha", "encoder"])
def test_parallel_attention_inference_matches_sequential_within_rounding(make):
    attnx.set_random_seed(0)
    layer = make()
    r = np.random.default_rng(1)
    xs = [r.normal(size=(int(b), int(t), 64)).astype(np.float32)
          for b, t in zip(r.integers(1, 24, size=45), r.integers(1, 96, size=45))]
    call = (lambda x: layer(x, x)) if isinstance(layer, layers.MultiHeadAttention) else layer
    sequential = [call(x) for x in xs]
    for _ in range(2):
        got = _run_threads([lambda i=i: [call(x) for x in xs[i::THREADS]] for i in range(THREADS)])
        for i, outs in enumerate(got):
            for out, want in zip(outs, sequential[i::THREADS]):
                np.testing.assert_allclose(out, want, rtol=ATTENTION_RTOL, atol=ATTENTION_ATOL)


def test_parallel_layer_calls_share_weights_safely():
    """Direct layer calls (inference) from many threads on one Dense layer."""
    layer = layers.Dense(64, activation="tanh")
    r = np.random.default_rng(2)
    xs = [r.normal(size=(int(n), 48)).astype(np.float32) for n in r.integers(1, 300, size=32)]
    want = [layer(x) for x in xs]
    got = _run_threads([lambda i=i: [layer(x) for x in xs[i::THREADS]] for i in range(THREADS)])
    for i, outs in enumerate(got):
        for out, w in zip(outs, want[i::THREADS]):
            np.testing.assert_array_equal(out, w)


def _train(model, x, y, epochs=2):
    history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, shuffle=False)
    return history.history["loss"], [w.copy() for w in model.get_weights()]


def test_training_and_inference_on_different_models_do_not_interfere():
    x, y = _data(3)
    alone = _train(_classifier(10), x, y)
    infer_model = _classifier(11)
    xq = _data(4, n=64)[0]
    infer_alone = infer_model.predict(xq)

    trainee = _classifier(10)
    results = _run_threads([lambda: _train(trainee, x, y)] +
                           [lambda: [infer_model.predict(xq) for _ in range(4)] for _ in range(THREADS - 1)])
    losses, weights = results[0]
    assert losses == alone[0]
    for a, b in zip(weights, alone[1]):
        np.testing.assert_array_equal(a, b)
    for preds in results[1:]:
        for p in preds:
            np.testing.assert_array_equal(p, infer_alone)


def test_two_trainings_side_by_side_equal_each_alone():
    x1, y1 = _data(5)
    r = np.random.default_rng(6)
    x2, y2 = r.normal(size=(64, 7, 5)).astype(np.float32), r.integers(0, 2, 64)
    alone1 = _train(_classifier(20), x1, y1)
    alone2 = _train(_recurrent(21), x2, y2, epochs=1)
    m1, m2 = _classifier(20), _recurrent(21)
    (l1, w1), (l2, w2) = _run_threads([lambda: _train(m1, x1, y1), lambda: _train(m2, x2, y2, epochs=1)])
    assert l1 == alone1[0] and l2 == alone2[0]
    for a, b in zip(w1 + w2, alone1[1] + alone2[1]):
        np.testing.assert_array_equal(a, b)


def test_kernels_release_the_gil():
    """While the main thread is inside one long dense_forward, a pure-Python thread keeps counting
    at a good fraction of its solo rate; were the GIL held for the call, it could not count at all."""
    r = np.random.default_rng(7)
    x = r.normal(size=(1200, 1200)).astype(np.float32)
    w = r.normal(size=(1200, 1200)).astype(np.float32)
    previous = attnx.backend.get_num_threads()
    attnx.set_num_threads(1)  # one core for the kernel, one for the spinner
    try:
        n = 1
        while True:  # a call long enough to measure (>= 0.15 s)
            start = time.perf_counter()
            _core.dense_forward(np.tile(x, (n, 1)), w, None, "tanh")
            if time.perf_counter() - start >= 0.15 or n >= 64:
                break
            n *= 2
        big = np.tile(x, (n, 1))
        ticks, stop = [0], threading.Event()

        def spin():
            while not stop.is_set():
                ticks[0] += 1
        spinner = threading.Thread(target=spin)
        spinner.start()
        try:
            t0, c0 = time.perf_counter(), ticks[0]
            time.sleep(0.1)
            solo_rate = (ticks[0] - c0) / (time.perf_counter() - t0)
            t0, c0 = time.perf_counter(), ticks[0]
            _core.dense_forward(big, w, None, "tanh")
            during_rate = (ticks[0] - c0) / (time.perf_counter() - t0)
        finally:
            stop.set()
            spinner.join()
    finally:
        attnx.set_num_threads(previous)
    assert during_rate > 0.05 * solo_rate, (during_rate, solo_rate)


def test_run_side_by_side_returns_both_results_and_raises_their_errors():
    from attnx import backend
    previous = _core.get_num_threads()
    attnx.set_num_threads(2)
    try:
        assert backend.run_side_by_side(lambda: 1, lambda: 2) == (1, 2)
        # inside a task, a nested pair runs in turn (the helper thread is the one running the task)
        nested = backend.run_side_by_side(lambda: backend.run_side_by_side(lambda: "a", lambda: "b"),
                                          lambda: backend.run_side_by_side(lambda: "c", lambda: "d"))
        assert nested == (("a", "b"), ("c", "d"))

        def fail(message):
            raise ValueError(message)
        with pytest.raises(ValueError, match="second"):
            backend.run_side_by_side(lambda: 1, lambda: fail("second"))
        with pytest.raises(ValueError, match="first"):
            backend.run_side_by_side(lambda: fail("first"), lambda: 2)
        assert backend.run_side_by_side(lambda: 3, lambda: 4) == (3, 4)  # still usable after errors
    finally:
        attnx.set_num_threads(previous)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "SimpleRNN"])
def test_bidirectional_on_two_threads_equals_one_thread_bit_for_bit(cell):
    """A Bidirectional layer runs its directions side by side on a budget of two threads, each
    direction's kernels on one thread: outputs and every gradient equal those of a budget of one."""
    rng = np.random.default_rng(1)
    # big enough that one direction alone splits its batch across two threads
    x = rng.standard_normal((48, 9, 16)).astype(np.float32)
    mask = np.arange(9)[None, :] < rng.integers(0, 10, 48)[:, None]
    dy = rng.standard_normal((48, 9, 2 * 48)).astype(np.float32)

    def run(threads):
        attnx.set_num_threads(threads)
        attnx.set_random_seed(0)
        layer = layers.Bidirectional(getattr(layers, cell)(48, return_sequences=True, num_layers=2))
        layer.build(x.shape)
        y, cache = layer.forward(x, training=True, mask=mask)
        dx = layer.backprop(cache, dy)
        return [y, dx] + [layer.grads[name] for name in sorted(layer.grads)]
    previous = _core.get_num_threads()
    try:
        one, two = run(1), run(2)
    finally:
        attnx.set_num_threads(previous)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make", [lambda: layers.MultiHeadAttention(4, 32),
                                  lambda: layers.Bidirectional(layers.LSTM(32, return_sequences=True))],
                         ids=["mha_worker_pool", "bidirectional_side_by_side"])
def test_forked_child_runs_parallel_kernels(make):
    """The kernels' worker threads, and the helper thread that runs a bidirectional layer's second
    direction, do not survive fork(): a forked child (multiprocessing's default start method on
    Linux) starts its own and computes what the parent does, instead of waiting forever on threads
    it does not have."""
    import os
    import select
    import signal

    attnx.set_num_threads(2)
    attnx.set_random_seed(0)
    layer = make()
    x = np.random.default_rng(0).standard_normal((16, 64, 64)).astype(np.float32)
    want = layer([x, x]) if isinstance(layer, layers.MultiHeadAttention) else layer(x)  # the parent's threads run
    call = (lambda: layer([x, x])) if isinstance(layer, layers.MultiHeadAttention) else (lambda: layer(x))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: compute, send the bytes, leave without running pytest's exit handlers
        try:
            os.write(write_end, np.ascontiguousarray(call()).tobytes())
        finally:
            os._exit(0)
    os.close(write_end)
    got = b""
    try:
        while len(got) < want.nbytes:
            ready, _, _ = select.select([read_end], [], [], 60)
            assert ready, "forked child hung in a kernel"
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            got += chunk
    finally:
        os.close(read_end)
        if os.waitpid(pid, os.WNOHANG) == (0, 0):  # still running: hung
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    np.testing.assert_array_equal(np.frombuffer(got, np.float32).reshape(want.shape), want)
