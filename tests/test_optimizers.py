"""Optimizers against torch.optim over 10 steps, gradient clipping against torch.nn.utils, and
learning-rate schedules against Keras' formulas."""
import math

import numpy as np
import pytest

from attnx import optimizers
from attnx.testing import assert_close

SHAPES = [(4, 3), (3,), (2, 2, 2)]


def run_parity(torch, make_ours, make_torch, steps=10, seed=0, grad_scale=1.0, atol=1e-5):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    tparams = [torch.nn.Parameter(torch.tensor(p.copy())) for p in params]
    opt = make_ours()
    topt = make_torch(tparams)
    for step in range(steps):
        grads = [(rng.standard_normal(s) * grad_scale).astype(np.float32) for s in SHAPES]
        for tp, g in zip(tparams, grads):
            tp.grad = torch.tensor(g.copy())
        topt.step()
        opt.apply(list(zip(params, [g.copy() for g in grads])))
        for i, (p, tp) in enumerate(zip(params, tparams)):
            assert_close(p, tp.detach().numpy(), atol=atol, what=f"step {step + 1} param {i}")
    assert opt.iterations == steps
    return params


@pytest.mark.parametrize("kw", [
    dict(),
    dict(momentum=0.9),
    dict(momentum=0.9, nesterov=True),
    dict(weight_decay=0.01),
    dict(momentum=0.8, nesterov=True, weight_decay=0.05),
], ids=["plain", "momentum", "nesterov", "weight_decay", "all"])
def test_sgd_parity(torch, kw):
    run_parity(torch, lambda: optimizers.SGD(learning_rate=0.1, **kw),
               lambda ps: torch.optim.SGD(ps, lr=0.1, **kw))


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adam_parity(torch, wd):
    run_parity(torch, lambda: optimizers.Adam(learning_rate=0.01, beta_1=0.8, beta_2=0.95, epsilon=1e-8,
                                              weight_decay=wd),
               lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.95), eps=1e-8, weight_decay=wd))


def test_adamw_parity(torch):
    run_parity(torch, lambda: optimizers.AdamW(learning_rate=0.01, weight_decay=0.1, epsilon=1e-8),
               lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, eps=1e-8))


@pytest.mark.parametrize("kw", [
    dict(),
    dict(momentum=0.9),
    dict(centered=True),
    dict(momentum=0.5, centered=True, weight_decay=0.01),
], ids=["plain", "momentum", "centered", "all"])
def test_rmsprop_parity(torch, kw):
    run_parity(torch, lambda: optimizers.RMSprop(learning_rate=0.01, rho=0.9, epsilon=1e-8, **kw),
               lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, eps=1e-8, **kw))


def test_keras_defaults():
    assert optimizers.Adam().learning_rate == 0.001 and optimizers.Adam().epsilon == 1e-7
    assert optimizers.SGD().learning_rate == 0.01
    assert optimizers.RMSprop().rho == 0.9
    assert optimizers.AdamW().weight_decay == 0.004
    for name, cls in [("sgd", optimizers.SGD), ("adam", optimizers.Adam), ("adamw", optimizers.AdamW),
                      ("rmsprop", optimizers.RMSprop)]:
        opt = optimizers.get(name)
        assert type(opt) is cls
        assert optimizers.get(optimizers.serialize(opt)).get_config() == opt.get_config()


def test_float64_params_update():
    p = np.ones(3)
    optimizers.SGD(learning_rate=0.5).apply([(p, np.array([1.0, 2.0, -2.0]))])
    assert_close(p, [0.5, 0.0, 2.0], atol=0)


# ------------------------------------------------------------------------------ clipping
def _clip_case(torch, opt_kwargs, torch_clip):
    rng = np.random.default_rng(1)
    grads = [(rng.standard_normal(s) * 3).astype(np.float32) for s in SHAPES]
    params = [np.zeros(s, dtype=np.float32) for s in SHAPES]
    optimizers.SGD(learning_rate=1.0, **opt_kwargs).apply(list(zip(params, [g.copy() for g in grads])))
    tparams = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    for tp, g in zip(tparams, grads):
        tp.grad = torch.tensor(g.copy())
    torch_clip(tparams)
    for p, tp in zip(params, tparams):
        assert_close(-p, tp.grad.numpy(), atol=1e-6)
    return params


def test_global_clipnorm(torch):
    params = _clip_case(torch, dict(global_clipnorm=1.5),
                        lambda ps: torch.nn.utils.clip_grad_norm_(ps, 1.5))
    assert math.sqrt(sum(float(np.sum(p.astype(np.float64) ** 2)) for p in params)) == pytest.approx(1.5, rel=1e-5)


def test_clipnorm_per_parameter(torch):
    def per_param(ps):
        for p in ps:
            torch.nn.utils.clip_grad_norm_([p], 0.7)
    params = _clip_case(torch, dict(clipnorm=0.7), per_param)
    for p in params:
        assert np.linalg.norm(p) == pytest.approx(0.7, rel=1e-5)


def test_clipvalue(torch):
    _clip_case(torch, dict(clipvalue=0.5), lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.5))


def test_clip_small_gradients_untouched():
    p = np.zeros(3, dtype=np.float32)
    optimizers.SGD(learning_rate=1.0, global_clipnorm=10.0).apply([(p, np.array([1, 2, 2], dtype=np.float32))])
    assert_close(p, [-1, -2, -2], atol=0)
    with pytest.raises(ValueError, match="Only one"):
        optimizers.SGD(clipnorm=1.0, global_clipnorm=1.0)


# ------------------------------------------------------------------------------ schedules
@pytest.mark.parametrize("staircase", [False, True])
def test_exponential_decay(staircase):
    s = optimizers.ExponentialDecay(0.1, decay_steps=4, decay_rate=0.5, staircase=staircase)
    for step in range(13):
        p = step / 4
        if staircase:
            p = math.floor(p)
        assert s(step) == pytest.approx(0.1 * 0.5 ** p, rel=1e-12)


def test_piecewise_constant_decay():
    s = optimizers.PiecewiseConstantDecay([3, 7], [1.0, 0.5, 0.1])
    expected = {0: 1.0, 3: 1.0, 4: 0.5, 7: 0.5, 8: 0.1, 100: 0.1}  # Keras: values[i] while step <= boundary
    for step, lr in expected.items():
        assert s(step) == lr
    with pytest.raises(ValueError):
        optimizers.PiecewiseConstantDecay([3], [1.0])


def test_cosine_decay():
    s = optimizers.CosineDecay(0.2, decay_steps=10, alpha=0.1)
    for step in range(15):
        t = min(step, 10) / 10
        assert s(step) == pytest.approx(0.2 * ((1 - 0.1) * 0.5 * (1 + math.cos(math.pi * t)) + 0.1), rel=1e-12)


def test_cosine_decay_with_warmup():
    init, target, warm, decay = 0.0, 1.0, 5, 10
    s = optimizers.CosineDecay(init, decay_steps=decay, warmup_target=target, warmup_steps=warm)
    for step in range(20):
        if step < warm:
            expected = init + (target - init) * step / warm
        else:
            t = min(step - warm, decay) / decay
            expected = target * 0.5 * (1 + math.cos(math.pi * t))
        assert s(step) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert s(warm) == pytest.approx(target)


def test_schedule_drives_optimizer_lr():
    sched = optimizers.ExponentialDecay(1.0, decay_steps=1, decay_rate=0.5)
    opt = optimizers.SGD(learning_rate=sched)
    p = np.zeros(1, dtype=np.float32)
    for _ in range(3):
        opt.apply([(p, np.ones(1, dtype=np.float32))])
    assert_close(p, [-(1.0 + 0.5 + 0.25)], atol=1e-7)
    clone = optimizers.get(optimizers.serialize(opt))
    assert isinstance(clone.learning_rate, optimizers.ExponentialDecay)
    assert clone.learning_rate(3) == sched(3)


# ---------------------------------------------------------------------------------- errors
def test_shape_mismatch_error():
    opt = optimizers.Adam()
    with pytest.raises(ValueError, match=r"\(3,\).*does not match parameter.*\(4,\)"):
        opt.apply([(np.zeros(4, dtype=np.float32), np.zeros(3, dtype=np.float32))])
    with pytest.raises(ValueError, match="does not match"):
        opt.apply([(np.zeros(4, dtype=np.float32), np.zeros(4, dtype=np.float64))])
    p = np.zeros(4, dtype=np.float32)
    p.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        optimizers.SGD().apply([(p, np.zeros(4, dtype=np.float32))])


def test_gradient_layouts_and_no_mutation_of_gradients():
    rng = np.random.default_rng(3)
    g = rng.standard_normal((4, 3)).astype(np.float32)
    variants = [g.copy(), np.asfortranarray(g), np.repeat(g, 2, axis=1)[:, ::2]]
    ro = g.copy()
    ro.flags.writeable = False
    variants.append(ro)
    for clip in ({}, {"clipnorm": 0.5}, {"global_clipnorm": 0.5}, {"clipvalue": 0.1}):
        results = []
        for v in variants:
            p = np.ones((4, 3), dtype=np.float32)
            before = np.array(v)
            optimizers.Adam(0.1, **clip).apply([(p, v)])
            assert np.array_equal(np.asarray(v), before)  # clipping works on a copy
            results.append(p)
        assert all(np.array_equal(r, results[0]) for r in results), clip


def test_zero_gradients_zeroes_every_buffer_and_nothing_else():
    """ops.zero_gradients: each float dtype's buffers in one kernel call split across the threads (sizes
    that cut arrays mid-way, an empty one, one past the parallel threshold), other layouts with fill."""
    from attnx import ops
    rng = np.random.default_rng(0)
    buffers = [rng.standard_normal(n).astype(dtype) for n, dtype in
               [(7, np.float32), (0, np.float32), (300_001, np.float32), (5, np.float64), (200_003, np.float64)]]
    strided = rng.standard_normal((6, 4)).astype(np.float32)[:, ::2]  # not contiguous: fill
    ints = np.arange(5)
    neighbour = rng.standard_normal(10).astype(np.float32)
    window = neighbour[2:7]  # a view: only its elements change
    before = neighbour.copy()
    ops.zero_gradients(buffers + [strided, ints, window])
    for b in buffers + [strided, ints, window]:
        assert not np.any(b), b.dtype
    np.testing.assert_array_equal(neighbour[:2], before[:2])
    np.testing.assert_array_equal(neighbour[7:], before[7:])
