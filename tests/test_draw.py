"""DRAW's filterbank read and write (attnx.layers.FilterbankRead / FilterbankWrite): the C++ kernels
against a PyTorch implementation of the paper's equations (section 3.2), float64 gradient checks,
the window's meaning and bad input."""
import numpy as np
import pytest

from attnx import layers
from attnx.testing import assert_close, gradcheck


def torch_filterbanks(torch, params, N, H, W):
    """Fx (B, N, W), Fy (B, N, H), gamma (B,) from params (B, 5), the paper's equations."""
    gx = (W + 1) / 2 * (params[:, 0] + 1)
    gy = (H + 1) / 2 * (params[:, 1] + 1)
    s2 = torch.exp(params[:, 2])
    delta = (max(H, W) - 1) / (N - 1) * torch.exp(params[:, 3]) if N > 1 else 0 * params[:, 3]
    gamma = torch.exp(params[:, 4])
    offsets = torch.arange(1, N + 1, dtype=params.dtype) - N / 2 - 0.5

    def bank(g, L):
        mu = g[:, None] + offsets[None] * delta[:, None]  # (B, N)
        a = torch.arange(1, L + 1, dtype=params.dtype)
        e = torch.exp(-(a[None, None] - mu[:, :, None]) ** 2 / (2 * s2[:, None, None]))
        return e / (e.sum(-1, keepdim=True) + 1e-8)

    return bank(gx, W), bank(gy, H), gamma, torch.stack([gx, gy, s2, delta, gamma], 1)


def random_params(rng, B):
    return np.stack([rng.uniform(-1, 1, B), rng.uniform(-1, 1, B), rng.uniform(-0.5, 1.0, B),
                     rng.uniform(-1.0, 0.0, B), rng.uniform(-0.5, 0.5, B)], 1)


@pytest.mark.parametrize("dtype,atol", [("float64", 1e-10), ("float32", 1e-5)])
@pytest.mark.parametrize("case", range(5))
def test_read_and_write_match_torch(torch, dtype, atol, case):
    rng = np.random.default_rng(case)
    B, H, W = int(rng.integers(1, 5)), int(rng.integers(4, 20)), int(rng.integers(4, 20))
    N = int(rng.integers(1, 7))
    params = random_params(rng, B).astype(dtype)
    image = rng.random((B, H, W)).astype(dtype)
    patch = rng.standard_normal((B, N, N)).astype(dtype)
    tp = torch.tensor(params, requires_grad=True)
    timg, tpatch = torch.tensor(image, requires_grad=True), torch.tensor(patch, requires_grad=True)
    fx, fy, gamma, window = torch_filterbanks(torch, tp, N, H, W)
    t_glimpse = gamma[:, None, None] * fy @ timg @ fx.transpose(1, 2)
    t_canvas = fy.transpose(1, 2) @ tpatch @ fx / gamma[:, None, None]

    read = layers.FilterbankRead(N, return_window=True, dtype=dtype)
    write = layers.FilterbankWrite(H, W, dtype=dtype)
    glimpse, win = read([image, params], training=True)
    canvas = write([patch, params], training=True)
    assert_close(glimpse, t_glimpse.detach().numpy(), atol, what="glimpse")
    assert_close(win, window.detach().numpy(), atol * 100, what="window")
    assert_close(canvas, t_canvas.detach().numpy(), atol * 10, what="canvas")

    dg, dc = rng.standard_normal(glimpse.shape).astype(dtype), rng.standard_normal(canvas.shape).astype(dtype)
    dimage, dparams_read = read.backward([dg, None])
    dpatch, dparams_write = write.backward(dc)
    torch.autograd.backward([t_glimpse, t_canvas], [torch.tensor(dg), torch.tensor(dc)])
    assert_close(dimage, timg.grad.numpy(), atol, what="dimage")
    assert_close(dpatch, tpatch.grad.numpy(), atol * 10, what="dpatch")
    assert_close(dparams_read + dparams_write, tp.grad.numpy(), atol * 1000, rtol=atol * 10, what="dparams")


@pytest.mark.parametrize("layer_fn,x_shape", [
    (lambda: layers.FilterbankRead(3, dtype="float64"), (2, 7, 9)),
    (lambda: layers.FilterbankWrite(7, 9, dtype="float64"), (2, 3, 3)),
    (lambda: layers.FilterbankRead(1, dtype="float64"), (2, 5, 5)),
])
def test_gradcheck(layer_fn, x_shape):
    rng = np.random.default_rng(1)
    gradcheck(layer_fn(), [rng.random(x_shape), random_params(rng, x_shape[0])], atol=1e-7, rtol=1e-5)


def test_window_reads_where_it_points():
    """A sharp window (small sigma, delta 1 pixel, gamma 1) centred on a bright block reads the
    block; writing a patch puts it at the window's centre."""
    H = W = 16
    image = np.zeros((1, H, W))
    image[0, 2:5, 10:13] = 1.0  # rows 3-5, columns 11-13 counted from 1
    gx, gy = 12.0, 4.0
    params = np.array([[2 * gx / (W + 1) - 1, 2 * gy / (H + 1) - 1, np.log(0.05), np.log(2 / 15), 0.0]])
    glimpse, window = layers.FilterbankRead(3, return_window=True, dtype="float64")([image, params])
    assert_close(window[0, :2], [gx, gy], 1e-12, what="centre")
    assert_close(window[0, 3], 1.0, 1e-12, what="delta")
    assert_close(glimpse[0], np.ones((3, 3)), 1e-3, what="glimpse")
    canvas = layers.FilterbankWrite(H, W, dtype="float64")([np.ones((1, 3, 3)), params])
    assert_close(canvas, image, 1e-3, what="written patch")


@pytest.mark.parametrize("make,inputs,error,words", [
    (lambda: layers.FilterbankRead(3), [np.zeros((2, 5, 5))], ValueError, "image, params"),
    (lambda: layers.FilterbankRead(3), [np.zeros((2, 5)), np.zeros((2, 5))], ValueError, "rank 3"),
    (lambda: layers.FilterbankRead(3), [np.zeros((2, 5, 5)), np.zeros((2, 4))], ValueError, "last axis"),
    (lambda: layers.FilterbankRead(3), [np.zeros((2, 5, 5)), np.zeros((3, 5))], ValueError, "rows"),
    (lambda: layers.FilterbankWrite(8, 8), [np.zeros((2, 3, 4)), np.zeros((2, 5))], ValueError, "square"),
    (lambda: layers.FilterbankRead(3), [np.array([[["x"]]]), np.zeros((1, 5))], TypeError, "numeric"),
])
def test_bad_input(make, inputs, error, words):
    with pytest.raises(error, match=words):
        make()(inputs)


def test_bad_arguments():
    with pytest.raises(ValueError, match="`n`"):
        layers.FilterbankRead(0)
    with pytest.raises(ValueError, match="height"):
        layers.FilterbankWrite(0, 4)


# ------------------------------------------------------------------------------------- the model
@pytest.mark.parametrize("kwargs, words", [
    ({"steps": 1025}, "steps.*<= 1024"), ({"steps": 10 ** 8}, "steps"), ({"height": 4097}, "height.*<= 4096"),
    ({"read_n": 9}, "read_n.*<= 8"), ({"write_n": 9}, "write_n"), ({"encoder_units": 8193}, "encoder_units"),
    ({"latent_dim": 10 ** 6}, "latent_dim"), ({"steps": 2.5}, "steps.*positive integer"), ({"height": "8"}, "height"),
])
def test_draw_arguments_are_bounded(kwargs, words):
    from attnx.draw import DRAW
    config = dict(height=8, width=8, read_n=2, write_n=3, steps=2, encoder_units=4, decoder_units=4, latent_dim=2)
    config.update(kwargs)
    with pytest.raises(ValueError, match=words):
        DRAW(**config)
    model = DRAW(8, 8, read_n=2, write_n=3, steps=2, encoder_units=4, decoder_units=4, latent_dim=2)
    for n, steps in ((0, None), (2, 1025), (2.5, None), (10 ** 9, None)):
        with pytest.raises(ValueError, match="DRAW.generate"):
            model.generate(n, steps=steps)


# Saved and loaded in a fresh process (fit(images), the default compile's kl_mean found without
# custom_objects): tests/test_fresh_process_load.py, the contract over every public class.


def digit_images(scale=2):
    """scikit-learn's 8x8 digits in [0, 1], each pixel a scale x scale block."""
    from sklearn.datasets import load_digits
    images = load_digits().images / 16.0
    return np.kron(images, np.ones((scale, scale))).astype(np.float32)


def test_draw_gradients_match_finite_differences():
    from attnx.draw import DRAW
    rng = np.random.default_rng(3)
    model = DRAW(6, 7, read_n=2, write_n=3, steps=3, encoder_units=4, decoder_units=5, latent_dim=2, dtype="float64")
    # the same latent samples (eps) in every forward pass: reseeded before each
    gradcheck(model, rng.random((2, 6, 7)), check_inputs=False, max_elements=4, atol=1e-6, random_seed=5)


def test_draw_learns_digits_and_generates(tmp_path):
    """DRAW on 16 x 16 digits: the test bound per pixel closes a quarter of the gap between the best
    constant image (each pixel its training mean) and a perfect reconstruction (the pixels' own
    entropy); measured 0.349 against 0.420 and 0.209 after 10 epochs. generate returns every step's
    canvas and write window, and plot_steps tiles them."""
    import attnx
    from attnx.draw import DRAW, plot_steps
    attnx.set_random_seed(0)
    images = digit_images()
    train, test = images[:1400], images[1400:]
    model = DRAW(16, 16, read_n=5, write_n=5, steps=8, encoder_units=64, decoder_units=64, latent_dim=8)
    model.compile(optimizer=attnx.optimizers.Adam(3e-3))
    history = model.fit(train, train, epochs=10, batch_size=25, verbose=0, validation_data=(test, test))
    p = np.clip(train.mean(0), 1e-6, 1 - 1e-6)
    constant = float(-np.mean(test * np.log(p) + (1 - test) * np.log(1 - p)))
    q = np.clip(test.astype(np.float64), 1e-9, 1 - 1e-9)
    floor = float(-np.mean(test * np.log(q) + (1 - test) * np.log(1 - q)))
    bound = history.history["val_loss"][-1]
    assert bound < constant - 0.25 * (constant - floor), (bound, constant, floor, history.history["val_loss"])
    canvases, windows = model.generate(4, seed=0)
    assert canvases.shape == (8, 4, 16, 16) and windows.shape == (8, 4, 5)
    assert np.all((canvases >= 0) & (canvases <= 1)) and np.all(windows[..., 2:] > 0)
    assert_close(model.generate(4, seed=0)[0], canvases, 0, what="seeded generation")
    plot_steps(canvases, windows, write_n=5).savefig(tmp_path / "steps.png")
    assert (tmp_path / "steps.png").stat().st_size > 0
