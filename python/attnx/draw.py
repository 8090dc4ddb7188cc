"""DRAW (Gregor et al. 2015, "DRAW: A Recurrent Neural Network For Image Generation"): a variational
autoencoder whose LSTM encoder reads the image and whose LSTM decoder writes it onto a canvas step
by step, each through an attention window (`attnx.layers.FilterbankRead` / `FilterbankWrite`).

Step t = 1..T (the paper's equations 3-8)::

    x^_t = x - sigmoid(c_{t-1})
    r_t  = [read(x, h_dec_{t-1}), read(x^_t, h_dec_{t-1})]       one window for both, from h_dec_{t-1}
    h_enc_t = LSTM_enc(h_enc_{t-1}, [r_t, h_dec_{t-1}])
    z_t ~ N(mu_t, sigma_t),  mu_t = h_enc_t W_mu,  log sigma_t = h_enc_t W_sigma   (z = mu + sigma eps)
    h_dec_t = LSTM_dec(h_dec_{t-1}, z_t)
    c_t  = c_{t-1} + write(h_dec_t W_w, h_dec_t)                 the window from h_dec_t
    loss = sum_pixels BCE(x, sigmoid(c_T)) + sum_t KL(N(mu_t, sigma_t) || N(0, 1))

The model trains through `fit(images)` (images (B, H, W) in [0, 1]): its outputs are the canvas
logits and each image's KL term, with the compiled losses BCE (from logits) and the KL's mean,
weighted so that the loss is the negative log-likelihood bound per pixel. `generate(n)` draws z from
the prior and returns every step's canvas and write window.
"""
from typing import NamedTuple

import numpy as np

from . import backend, losses, ops, random, serialization
from .backend import unique_name
from .layers import Dense, FilterbankRead, FilterbankWrite, LSTMCell
from .models import Model


class _Step(NamedTuple):
    """The caches of one step's layer calls (training)."""
    read_params: object
    read_x: object
    read_xhat: object
    encoder: object
    mu: object
    log_sigma: object
    decoder: object
    write_patch: object
    write_params: object
    write: object
    mu_value: np.ndarray
    sigma: np.ndarray
    eps: np.ndarray
    canvas_prev: np.ndarray  # c_{t-1}, for x^_t's gradient


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@serialization.register_serializable("attnx")  # DRAW's default compile saves it by name
def kl_mean(y_true, y_pred):
    """The mean over the batch of the KL terms the model outputs (y_true is ignored)."""
    return ops.mean(y_pred)


class DRAW(Model):
    """DRAW with filterbank attention, as a model class.

    Args:
        height, width: image size.
        read_n, write_n: the read and write grids (the paper's 2 and 5 on 28 x 28 MNIST).
        steps: glimpses T.
        encoder_units, decoder_units: LSTM sizes.
        latent_dim: size of each z_t.
        seed: seed of the latent noise z_t (default: attnx's stream, `attnx.random`).

    Bounds (a saved file sets them, and the work and memory grow with them): ``steps`` <= 1024,
    ``height`` and ``width`` <= 4096, the grids <= the image's sides, units and ``latent_dim`` <= 8192.

    Layers: ``read_params`` / ``write_params`` (Dense 5: the windows), ``reader`` / ``writer``
    (FilterbankRead / FilterbankWrite), ``encoder`` / ``decoder`` (LSTMCell), ``mu`` / ``log_sigma``
    (Dense latent_dim), ``write_patch`` (Dense write_n^2).
    """

    _multi_output = True
    output_names = ("canvas", "kl")
    targets_from_inputs = True  # fit(images): train_data makes the targets
    MAX_STEPS, MAX_SIDE, MAX_UNITS = 1024, 4096, 8192
    MAX_GENERATE, MAX_CANVAS_VALUES = 1 << 16, 2 ** 31 - 1  # generate's images per call and its output's size

    def __init__(self, height, width, read_n=2, write_n=5, steps=8, encoder_units=64, decoder_units=64,
                 latent_dim=10, seed=None, dtype="float32", name=None):
        super().__init__(name=name or unique_name("draw"), dtype=dtype)
        self.seed_generator = random.SeedGenerator(seed, "DRAW")  # the latent samples
        self.seed = self.seed_generator.seed
        arguments = {"height": height, "width": width, "read_n": read_n, "write_n": write_n, "steps": steps,
                     "encoder_units": encoder_units, "decoder_units": decoder_units, "latent_dim": latent_dim}
        for arg, value in arguments.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"DRAW: `{arg}` must be a positive integer, got {value!r}")
        bounds = {"height": self.MAX_SIDE, "width": self.MAX_SIDE, "read_n": min(height, width),
                  "write_n": min(height, width), "steps": self.MAX_STEPS, "encoder_units": self.MAX_UNITS,
                  "decoder_units": self.MAX_UNITS, "latent_dim": self.MAX_UNITS}
        for arg, value in arguments.items():
            if value > bounds[arg]:
                raise ValueError(f"DRAW: `{arg}` must be <= {bounds[arg]}, got {value}")
        self.height, self.width, self.read_n, self.write_n = int(height), int(width), int(read_n), int(write_n)
        self.steps, self.latent_dim = int(steps), int(latent_dim)
        self.encoder_units, self.decoder_units = int(encoder_units), int(decoder_units)
        kw = {"dtype": dtype}
        self.read_params = Dense(5, name="read_params", **kw)
        self.write_params = Dense(5, name="write_params", **kw)
        self.reader = FilterbankRead(self.read_n, name="reader", **kw)
        self.writer = FilterbankWrite(self.height, self.width, return_window=True, name="writer", **kw)
        self.encoder = LSTMCell(self.encoder_units, name="encoder", **kw)
        self.decoder = LSTMCell(self.decoder_units, name="decoder", **kw)
        self.mu = Dense(self.latent_dim, name="mu", **kw)
        self.log_sigma = Dense(self.latent_dim, name="log_sigma", **kw)
        self.write_patch = Dense(self.write_n * self.write_n, name="write_patch", **kw)
        self.build()

    def build(self, input_shape=None):
        Hd, He, Z, R = self.decoder_units, self.encoder_units, self.latent_dim, self.read_n
        for layer, shape in ((self.read_params, (None, Hd)), (self.write_params, (None, Hd)),
                             (self.encoder, [(None, 2 * R * R + Hd), (None, He), (None, He)]),
                             (self.decoder, [(None, Z), (None, Hd), (None, Hd)]),
                             (self.mu, (None, He)), (self.log_sigma, (None, He)), (self.write_patch, (None, Hd))):
            if not layer.built:
                layer.build(shape)
                layer.built = True
        self.built = True

    def get_config(self):
        return {"name": self.name, "height": self.height, "width": self.width, "read_n": self.read_n,
                "write_n": self.write_n, "steps": self.steps, "encoder_units": self.encoder_units,
                "decoder_units": self.decoder_units, "latent_dim": self.latent_dim, "seed": self.seed,
                "dtype": self.dtype.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def compile(self, optimizer="adam", loss=None, metrics=None, loss_weights=None, distribute=None):
        """As `Model.compile`, with DRAW's defaults: Adam, the pixels' binary cross-entropy from the canvas
        logits and the KL term, weighted 1 / (height * width) so that the loss is the bound per pixel."""
        if loss is None:
            loss = [losses.BinaryCrossentropy(from_logits=True), kl_mean]
            loss_weights = [1.0, 1.0 / (self.height * self.width)] if loss_weights is None else loss_weights
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, loss_weights=loss_weights,
                        distribute=distribute)

    def train_data(self, x, y):
        """``fit(images)``: the targets are the images (flattened) and a zero per image for the KL output."""
        x = self._images(x)
        return x, [x.reshape(len(x), -1), np.zeros((len(x),), self.dtype)]

    def _images(self, x):
        x = np.asarray(x)
        if x.ndim != 3 or x.shape[1:] != (self.height, self.width):
            raise ValueError(f"Model '{self.name}': images expected shape (batch, {self.height}, {self.width}), got "
                             f"{x.shape}")
        if x.dtype.kind not in "fiu":
            raise TypeError(f"Model '{self.name}': images must be numeric, got dtype {x.dtype}")
        return np.ascontiguousarray(x, dtype=self.dtype)

    # ----------------------------------------------------------------------------- forward
    def forward(self, inputs, training=False):
        """images (B, H, W) -> ([canvas logits (B, H * W), KL per image (B,)], cache). Training draws
        eps ~ N(0, 1); inference uses z = mu."""
        x = self._images(inputs)
        B = len(x)
        dt = self.dtype
        canvas = np.zeros_like(x)
        h_enc = np.zeros((B, self.encoder_units), dt)
        c_enc = np.zeros_like(h_enc)
        h_dec = np.zeros((B, self.decoder_units), dt)
        c_dec = np.zeros_like(h_dec)
        kl = np.zeros(B, dt)
        steps = []
        noisy = backend.training_randomness(training)
        for _ in range(self.steps):
            canvas_prev = canvas
            xhat = x - _sigmoid(canvas_prev)
            p_read, c_rp = self.read_params.apply(h_dec, training=training)
            r_x, c_rx = self.reader.apply([x, p_read], training=training)
            r_xhat, c_rxh = self.reader.apply([xhat, p_read], training=training)
            enc_in = np.concatenate([r_x.reshape(B, -1), r_xhat.reshape(B, -1), h_dec], axis=1)
            (h_enc, c_enc), c_e = self.encoder.apply([enc_in, h_enc, c_enc], training=training)
            mu, c_mu = self.mu.apply(h_enc, training=training)
            log_sigma, c_ls = self.log_sigma.apply(h_enc, training=training)
            sigma = np.exp(log_sigma)
            eps = self.seed_generator.normal(mu.shape, dt) if noisy else np.zeros_like(mu)
            z = mu + sigma * eps
            # KL(N(mu, sigma) || N(0, 1)) = 1/2 sum (mu^2 + sigma^2 - 2 log sigma - 1)
            kl += 0.5 * np.sum(mu * mu + sigma * sigma - 2 * log_sigma - 1, axis=1)
            (h_dec, c_dec), c_d = self.decoder.apply([z, h_dec, c_dec], training=training)
            patch, c_wp = self.write_patch.apply(h_dec, training=training)
            p_write, c_wpar = self.write_params.apply(h_dec, training=training)
            (written, _), c_w = self.writer.apply([patch.reshape(B, self.write_n, self.write_n), p_write],
                                                  training=training)
            canvas = canvas_prev + written
            steps.append(_Step(c_rp, c_rx, c_rxh, c_e, c_mu, c_ls, c_d, c_wp, c_wpar, c_w, mu, sigma, eps,
                               canvas_prev))
        return [canvas.reshape(B, -1), kl], ((steps, B) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        steps, B = cache
        dcanvas_flat, dkl = dy
        dt = self.dtype
        dcanvas = np.zeros((B, self.height, self.width), dt) if dcanvas_flat is None else \
            np.asarray(dcanvas_flat, dt).reshape(B, self.height, self.width).copy()
        dkl = np.zeros(B, dt) if dkl is None else np.asarray(dkl, dt).reshape(B)
        R2 = self.read_n * self.read_n
        dh_dec = np.zeros((B, self.decoder_units), dt)  # from step t + 1 (its read window and its encoder input)
        dc_dec = np.zeros_like(dh_dec)
        dh_enc = np.zeros((B, self.encoder_units), dt)
        dc_enc = np.zeros_like(dh_enc)
        for s in reversed(steps):
            # c_t = c_{t-1} + write(...):  the write's inputs get dcanvas; c_{t-1} keeps it
            dpatch, dp_write = self.writer.backprop(s.write, [dcanvas, None])
            dh = self.write_patch.backprop(s.write_patch, dpatch.reshape(B, -1))
            dh = dh + self.write_params.backprop(s.write_params, dp_write) + dh_dec
            dz, dh_dec_prev, dc_dec_prev = self.decoder.backprop(s.decoder, [dh, dc_dec])
            # z = mu + sigma eps;  KL = 1/2 sum(mu^2 + sigma^2 - 2 log sigma - 1)
            dmu = dz + dkl[:, None] * s.mu_value
            dlog_sigma = dz * s.sigma * s.eps + dkl[:, None] * (s.sigma * s.sigma - 1)
            dh_enc_total = self.mu.backprop(s.mu, dmu) + self.log_sigma.backprop(s.log_sigma, dlog_sigma) + dh_enc
            denc_in, dh_enc, dc_enc = self.encoder.backprop(s.encoder, [dh_enc_total, dc_enc])
            dr_x = denc_in[:, :R2].reshape(B, self.read_n, self.read_n)
            dr_xhat = denc_in[:, R2:2 * R2].reshape(B, self.read_n, self.read_n)
            dh_dec_prev = dh_dec_prev + denc_in[:, 2 * R2:]
            _, dp_read_x = self.reader.backprop(s.read_x, dr_x)
            dxhat, dp_read_xhat = self.reader.backprop(s.read_xhat, dr_xhat)
            dh_dec_prev = dh_dec_prev + self.read_params.backprop(s.read_params, dp_read_x + dp_read_xhat)
            # x^_t = x - sigmoid(c_{t-1})
            sig = _sigmoid(s.canvas_prev)
            dcanvas = dcanvas - dxhat * sig * (1 - sig)
            dh_dec, dc_dec = dh_dec_prev, dc_dec_prev
        return None

    # ----------------------------------------------------------------------------- generation
    def generate(self, n, steps=None, seed=None):
        """Draws n images from the prior: z_t ~ N(0, 1) through the decoder and the writes.

        Returns (canvases (steps, n, H, W) as probabilities sigmoid(c_t) after each step, windows
        (steps, n, 5) = (gX, gY, sigma^2, delta, gamma) of each write, in pixels).

        Bounds: `n` <= `MAX_GENERATE` = 65536, `steps` (default the model's) <= `MAX_STEPS` = 1024, and
        the canvases at most `MAX_CANVAS_VALUES` = 2**31 - 1 values (steps * n * H * W)."""
        steps = self.steps if steps is None else steps
        for arg, value, bound in (("n", n, self.MAX_GENERATE), ("steps", steps, self.MAX_STEPS)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= bound:
                raise ValueError(f"DRAW.generate: `{arg}` must be an integer in [1, {bound}], got {value!r}")
        if steps * n * self.height * self.width > self.MAX_CANVAS_VALUES:
            raise ValueError(f"DRAW.generate: {steps} steps of {n} images of {self.height} x {self.width} are more "
                             f"than MAX_CANVAS_VALUES = {self.MAX_CANVAS_VALUES} values; draw fewer images per call")
        generator = self.seed_generator if seed is None else random.SeedGenerator(seed, "DRAW.generate")
        dt = self.dtype
        h = np.zeros((n, self.decoder_units), dt)
        c = np.zeros_like(h)
        canvas = np.zeros((n, self.height, self.width), dt)
        canvases, windows = [], []
        for _ in range(steps):
            z = generator.normal((n, self.latent_dim), dt)
            h, c = self.decoder([z, h, c])
            patch = self.write_patch(h).reshape(n, self.write_n, self.write_n)
            written, window = self.writer([patch, self.write_params(h)])
            canvas = canvas + written
            canvases.append(_sigmoid(canvas))
            windows.append(window)
        return np.stack(canvases), np.stack(windows)


def plot_steps(canvases, windows=None, write_n=5, axes=None):
    """Tiles `generate`'s canvases (steps, n, H, W): a row per image, a column per step, each write
    window drawn as a rectangle (its grid's extent: centre +- (write_n - 1) delta / 2). Returns the figure."""
    from .plot import _pyplot
    plt = _pyplot()
    T, n = canvases.shape[:2]
    if axes is None:
        fig, axes = plt.subplots(n, T, figsize=(T * 1.2, n * 1.2), squeeze=False)
    else:
        fig = np.asarray(axes).flat[0].figure
    axes = np.asarray(axes).reshape(n, T)
    for i in range(n):
        for t in range(T):
            ax = axes[i, t]
            ax.imshow(canvases[t, i], cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if windows is not None:
                gx, gy, _, delta, _ = windows[t, i]
                half = delta * (write_n - 1) / 2
                ax.add_patch(plt.Rectangle((gx - 1 - half, gy - 1 - half), 2 * half, 2 * half, fill=False,
                                           edgecolor="red", linewidth=1))
    return fig
