"""DRAW's read and write attention (Gregor et al. 2015): an N x N grid of Gaussian filters over an
image, placed by five numbers per image (a linear layer of the decoder state gives them)::

    params = (g~X, g~Y, log sigma^2, log delta~, log gamma)
    gX = (W + 1) / 2 (g~X + 1),  gY = (H + 1) / 2 (g~Y + 1),  delta = (max(H, W) - 1) / (N - 1) delta~
    read:  glimpse = gamma Fy image Fx^T   (N x N)
    write: canvas  = Fy^T patch Fx / gamma  (H x W)

with Fx (N, W), Fy (N, H) the normalised Gaussian filterbanks centred at gX + (i - N/2 - 1/2) delta
(pixels counted from 1). Forward and backward run in C++ (``cpp/include/attnx/draw.hpp``).
Images are (batch, H, W), one channel.
"""
from typing import NamedTuple

import numpy as np

from .. import kernels
from .base import Layer


class _AttendCache(NamedTuple):
    x: np.ndarray
    out: np.ndarray
    window: np.ndarray
    fx: np.ndarray
    fy: np.ndarray
    with_window: bool


class _Filterbank(Layer):
    """Shared by the read and the write: inputs [x, params (B, 5)], no weights."""

    _write = False

    def __init__(self, return_window=False, **kwargs):
        super().__init__(**kwargs)
        self.return_window = bool(return_window)

    def _inputs(self, inputs):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Layer '{self.name}': inputs must be [{'patch' if self._write else 'image'}, params]")
        x = self._float_input(inputs[0], "patch" if self._write else "image", ndim=3)
        params = self._float_input(inputs[1], "params", ndim=2, last_dim=5)
        if params.shape[0] != x.shape[0]:
            raise ValueError(f"Layer '{self.name}': `params` has {params.shape[0]} rows for a batch of {x.shape[0]}")
        return x, params

    def _finish(self, x, out, window, fx, fy, training):
        cache = _AttendCache(x, out, window, fx, fy, self.return_window) if training else None
        return ([out, window] if self.return_window else out), cache

    def backprop(self, cache, dy, need_dx=True):
        dout = dy[0] if cache.with_window else dy  # the window takes no gradient
        dout = self._grad_input(dout, cache.out.shape)
        dx, dparams = kernels.draw_attend_backward(dout=dout, out=cache.out, x=cache.x, window=cache.window,
                                                 fx=cache.fx, fy=cache.fy, write=self._write,
                                                 need_dx=need_dx)
        return [dx, dparams]

    def get_config(self):
        return {**super().get_config(), "return_window": self.return_window}


class FilterbankRead(_Filterbank):
    """DRAW's read: an (n, n) glimpse of (batch, H, W) images through the attention window.

    Args:
        n: the filter grid size N.
        return_window: also return the window (batch, 5) = (gX, gY, sigma^2, delta, gamma) in pixels.

    Call: ``layer([image (B, H, W), params (B, 5)])`` -> glimpse (B, n, n) (or [glimpse, window]);
    backprop returns ``[dimage, dparams]``.
    """

    def __init__(self, n, return_window=False, **kwargs):
        super().__init__(return_window=return_window, **kwargs)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"FilterbankRead: `n` must be a positive integer, got {n!r}")
        self.n = int(n)

    def forward(self, inputs, training=False):
        image, params = self._inputs(inputs)
        out, window, fx, fy = kernels.draw_read_forward(image=image, params=params, n=self.n)
        return self._finish(image, out, window, fx, fy, training)

    def compute_output_shape(self, input_shape):
        out = (input_shape[0][0], self.n, self.n)
        return [out, (input_shape[0][0], 5)] if self.return_window else out

    def get_config(self):
        return {**super().get_config(), "n": self.n}


class FilterbankWrite(_Filterbank):
    """DRAW's write: an (N, N) patch added through the attention window onto a (height, width) canvas.

    Args:
        height, width: the canvas size.
        return_window: also return the window (batch, 5) = (gX, gY, sigma^2, delta, gamma) in pixels.

    Call: ``layer([patch (B, N, N), params (B, 5)])`` -> canvas (B, height, width) (or [canvas,
    window]); backprop returns ``[dpatch, dparams]``.
    """

    _write = True

    def __init__(self, height, width, return_window=False, **kwargs):
        super().__init__(return_window=return_window, **kwargs)
        for arg, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"FilterbankWrite: `{arg}` must be a positive integer, got {value!r}")
        self.height, self.width = int(height), int(width)

    def forward(self, inputs, training=False):
        patch, params = self._inputs(inputs)
        if patch.shape[1] != patch.shape[2]:
            raise ValueError(f"Layer '{self.name}': `patch` must be square (batch, N, N), got {patch.shape}")
        out, window, fx, fy = kernels.draw_write_forward(patch=patch, params=params, height=self.height,
                                                       width=self.width)
        return self._finish(patch, out, window, fx, fy, training)

    def compute_output_shape(self, input_shape):
        out = (input_shape[0][0], self.height, self.width)
        return [out, (input_shape[0][0], 5)] if self.return_window else out

    def get_config(self):
        return {**super().get_config(), "height": self.height, "width": self.width}
