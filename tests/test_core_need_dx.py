"""Backward bindings that can skip their input gradient: need_dx=False returns None for it and
accumulates the same parameter gradients as need_dx=True."""
import numpy as np
import pytest

from attnx import _core

r = np.random.default_rng(0)


def f(*shape):
    return r.normal(size=shape)


def _dense(need_dx):
    x, W, b = f(4, 3), f(3, 2), f(2)
    y, z = _core.dense_forward(x=x, kernel=W, bias=b, activation="tanh")
    grads = {"dkernel": np.zeros_like(W), "dbias": np.zeros_like(b)}
    dx = _core.dense_backward(dy=np.ones_like(y), x=x, kernel=W, y=y, z=z, activation="tanh", need_dx=need_dx,
                              **grads)
    return dx, grads


def _layernorm(need_dx):
    x, g, b = f(4, 5), f(5), f(5)
    y, mean, rstd = _core.layernorm_forward(x=x, gamma=g, beta=b, eps=1e-5)
    grads = {"dgamma": np.zeros_like(g), "dbeta": np.zeros_like(b)}
    dx = _core.layernorm_backward(dy=np.cos(y), x=x, mean=mean, rstd=rstd, gamma=g, need_dx=need_dx, **grads)
    return dx, grads


def _pooling(need_dx):
    x, W, b = f(2, 4, 3), f(3, 1), f(4, 1)
    out, weights, energy = _core.attention_pooling_forward(x=x, kernel=W, bias=b, mask=np.array([[1, 1, 0, 1]] * 2))
    grads = {"dkernel": np.zeros_like(W), "dbias": np.zeros_like(b)}
    dx = _core.attention_pooling_backward(dout=np.sin(out), dweights=None, weights=weights, energy=energy, x=x,
                                          kernel=W, need_dx=need_dx, **grads)
    return dx, grads


def _rnn(need_dx):
    x, W, U = f(2, 3, 2), f(2, 12), f(3, 12)
    _, h, c, cache = _core.rnn_forward(cell="lstm", x=x, kernel=W, recurrent_kernel=U, bias=None, recurrent_bias=None,
                                       h0=None, c0=None, mask=None, recurrent_mask=None)
    grads = {"dkernel": np.zeros_like(W), "drecurrent_kernel": np.zeros_like(U)}
    dx, _, _ = _core.rnn_backward(cell="lstm", x=x, kernel=W, recurrent_kernel=U, cache=cache, mask=None,
                                  recurrent_mask=None, dy=None, dh=np.ones_like(h), dc=None, dbias=None,
                                  drecurrent_bias=None, need_dx=need_dx, **grads)
    return dx, grads


def _conv2d(need_dx):
    x, K, b = f(2, 6, 5, 3), f(3, 3, 3, 4), f(4)
    args = dict(x=x, kernel=K, strides=(2, 1), padding="same", activation="tanh")
    y, z = _core.conv2d_forward(bias=b, **args)
    grads = {"dkernel": np.zeros_like(K), "dbias": np.zeros_like(b)}
    dx = _core.conv2d_backward(dy=np.cos(y), y=y, z=z, need_dx=need_dx, **args, **grads)
    return dx, grads


@pytest.mark.parametrize("backward", [_dense, _layernorm, _pooling, _rnn, _conv2d],
                         ids=["dense", "layernorm", "pooling", "rnn", "conv2d"])
def test_need_dx_false_skips_only_the_input_gradient(backward):
    global r
    r = np.random.default_rng(0)
    dx, grads = backward(True)
    r = np.random.default_rng(0)
    no_dx, same_grads = backward(False)
    assert dx is not None and no_dx is None
    for name in grads:
        np.testing.assert_array_equal(same_grads[name], grads[name], err_msg=name)
