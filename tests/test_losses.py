"""Losses: value and gradient against float64 central differences, PyTorch parity (float32,
1e-5), numerical stability, sample weights, masks and bad labels."""
import numpy as np
import pytest

from attnx import losses
from attnx.testing import assert_close


def numeric_grad(loss, y_true, pred, eps=1e-6, **kw):
    pred = np.array(pred, dtype=np.float64)
    g = np.zeros_like(pred)
    for i in np.ndindex(pred.shape):
        p, m = pred.copy(), pred.copy()
        p[i] += eps
        m[i] -= eps
        g[i] = (loss(y_true, p, **kw) - loss(y_true, m, **kw)) / (2 * eps)
    return g


def check_grad(loss, y_true, pred, atol=1e-7, **kw):
    value, grad = loss.compute(y_true, np.asarray(pred, dtype=np.float64), **kw)
    assert np.isfinite(value)
    assert grad.shape == np.shape(pred) and grad.dtype == np.float64
    assert_close(grad, numeric_grad(loss, y_true, pred, **kw), atol=atol, what="gradient")
    return value, grad


def probs(rng, shape):
    z = rng.standard_normal(shape)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -------------------------------------------------------------------------- binary
def test_bce_from_logits_grad_and_value(rng):
    loss = losses.BinaryCrossentropy(from_logits=True)
    z = rng.standard_normal((6, 3)) * 3
    y = (rng.random((6, 3)) > 0.5).astype(np.float64)
    value, _ = check_grad(loss, y, z)
    expected = np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z))))
    assert value == pytest.approx(expected, rel=1e-12)


def test_bce_from_probs_grad_and_value(rng):
    loss = losses.BinaryCrossentropy()
    p = rng.uniform(0.05, 0.95, (5, 2))
    y = rng.random((5, 2))  # soft labels too
    value, _ = check_grad(loss, y, p)
    eps = 1e-7
    expected = -np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))  # Keras' formula
    assert value == pytest.approx(expected, rel=1e-12)


def test_bce_torch_parity(torch, rng):
    z = (rng.standard_normal((16, 1)) * 2).astype(np.float32)
    y = (rng.random((16, 1)) > 0.5).astype(np.float32)
    tz = torch.tensor(z, requires_grad=True)
    tl = torch.nn.BCEWithLogitsLoss()(tz, torch.from_numpy(y))
    tl.backward()
    value, grad = losses.BinaryCrossentropy(from_logits=True).compute(y, z)
    assert abs(value - tl.item()) < 1e-5
    assert_close(grad, tz.grad.numpy(), atol=1e-5)
    # labels (B,) for predictions (B, 1), as Keras accepts
    assert losses.BinaryCrossentropy(from_logits=True)(y[:, 0], z) == pytest.approx(value, abs=1e-7)

    p = rng.uniform(0.05, 0.95, (16, 3)).astype(np.float32)
    y3 = (rng.random((16, 3)) > 0.5).astype(np.float32)
    tp = torch.tensor(p, requires_grad=True)
    tl = torch.nn.BCELoss()(tp, torch.from_numpy(y3))
    tl.backward()
    value, grad = losses.BinaryCrossentropy().compute(y3, p)
    assert abs(value - tl.item()) < 1e-5
    assert_close(grad, tp.grad.numpy(), atol=1e-5)


def test_bce_stability_huge_logits():
    z = np.array([[1e4], [-1e4], [88.0], [-200.0], [0.0]], dtype=np.float32)
    y = np.array([[0], [1], [1], [0], [1]], dtype=np.float32)
    value, grad = losses.BinaryCrossentropy(from_logits=True).compute(y, z)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    assert value == pytest.approx((1e4 + 1e4 + 0 + 0 + np.log(2)) / 5, rel=1e-5)
    assert_close(grad[:, 0], np.array([1, -1, 0, 0, -0.5]) / 5, atol=1e-6)
    # probabilities of exactly 0 and 1 are clipped, not log(0)
    p = np.array([[0.0], [1.0], [1.0], [0.0]], dtype=np.float32)
    y = np.array([[1], [0], [1], [0]], dtype=np.float32)
    value, grad = losses.BinaryCrossentropy().compute(y, p)
    assert np.isfinite(value) and np.all(np.isfinite(grad)) and value > 5


# ------------------------------------------------------------------ sparse categorical
def test_sparse_cce_from_logits(rng):
    loss = losses.SparseCategoricalCrossentropy(from_logits=True)
    z = rng.standard_normal((4, 3, 5))
    labels = rng.integers(0, 5, (4, 3))
    value, _ = check_grad(loss, labels, z)
    lse = np.log(np.exp(z).sum(-1))
    expected = np.mean(lse - np.take_along_axis(z, labels[..., None], -1)[..., 0])
    assert value == pytest.approx(expected, rel=1e-12)


def test_sparse_cce_from_probs(rng):
    loss = losses.SparseCategoricalCrossentropy()
    p = probs(rng, (6, 4))
    labels = rng.integers(0, 4, 6)
    value, _ = check_grad(loss, labels, p)
    assert value == pytest.approx(-np.mean(np.log(p[np.arange(6), labels])), rel=1e-10)


def test_sparse_cce_mask_and_ignore_index(rng):
    z = rng.standard_normal((3, 4, 6))
    labels = rng.integers(1, 6, (3, 4))
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=bool)
    loss = losses.SparseCategoricalCrossentropy(from_logits=True)
    value, grad = check_grad(loss, labels, z, mask=mask)
    lse = np.log(np.exp(z).sum(-1))
    per = lse - np.take_along_axis(z, labels[..., None], -1)[..., 0]
    assert value == pytest.approx(per[mask].mean(), rel=1e-12)
    assert not grad[~mask].any()
    padded = np.where(mask, labels, 0)
    ig = losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0)
    v2, g2 = check_grad(ig, padded, z)
    assert v2 == pytest.approx(value, rel=1e-12)
    assert_close(g2, grad, atol=1e-15)


def test_sparse_cce_from_probs_mask_and_ignore_index(rng):
    p = probs(rng, (2, 5, 4))
    labels = rng.integers(1, 4, (2, 5))
    mask = np.array([[1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=bool)
    loss = losses.SparseCategoricalCrossentropy()
    value, grad = check_grad(loss, labels, p, mask=mask)
    per = -np.log(np.take_along_axis(p, labels[..., None], -1)[..., 0])
    assert value == pytest.approx(per[mask].mean(), rel=1e-10)
    assert not grad[~mask].any()
    ig = losses.SparseCategoricalCrossentropy(ignore_index=-1)
    v2, g2 = check_grad(ig, np.where(mask, labels, -1), p)
    assert v2 == pytest.approx(value, rel=1e-12)
    assert_close(g2, grad, atol=1e-15)
    # everything masked: zero loss and gradient, not NaN
    v3, g3 = loss.compute(labels, p, mask=np.zeros((2, 5), bool))
    assert v3 == 0.0 and not g3.any()


def test_sparse_cce_torch_parity(torch, rng):
    z = (rng.standard_normal((10, 7)) * 3).astype(np.float32)
    labels = rng.integers(0, 7, 10)
    labels[[2, 5]] = -100
    tz = torch.tensor(z, requires_grad=True)
    tl = torch.nn.CrossEntropyLoss(ignore_index=-100)(tz, torch.from_numpy(labels))
    tl.backward()
    value, grad = losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=-100).compute(labels, z)
    assert abs(value - tl.item()) < 1e-5
    assert_close(grad, tz.grad.numpy(), atol=1e-5)

    p = probs(rng, (10, 7)).astype(np.float32)
    labels = rng.integers(0, 7, 10)
    tp = torch.tensor(p, requires_grad=True)
    tl = torch.nn.NLLLoss()(torch.log(tp), torch.from_numpy(labels))
    tl.backward()
    value, grad = losses.SparseCategoricalCrossentropy().compute(labels, p)
    assert abs(value - tl.item()) < 1e-5
    # on the simplex the gradients differ by a per-row constant (the normalisation): compare
    # the directional derivative along directions that stay on the simplex
    d = rng.standard_normal((10, 7)).astype(np.float32)
    d -= d.mean(-1, keepdims=True)
    assert abs(np.sum(grad * d) - np.sum(tp.grad.numpy() * d)) < 1e-5


def test_sparse_cce_stability_huge_logits():
    z = np.array([[1e4, 0, -1e4], [-3e4, 3e4, 0]], dtype=np.float32)
    value, grad = losses.SparseCategoricalCrossentropy(from_logits=True).compute(np.array([1, 1]), z)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    assert value == pytest.approx(1e4 / 2, rel=1e-5)


def test_sparse_cce_bad_labels(rng):
    loss = losses.SparseCategoricalCrossentropy(from_logits=True)
    z = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(IndexError, match="out of range"):
        loss(np.array([0, 4, 1]), z)
    with pytest.raises(IndexError, match="out of range"):
        loss(np.array([0, -1, 1]), z)
    with pytest.raises(ValueError, match="shape"):
        loss(np.array([0, 1]), z)
    with pytest.raises(ValueError, match="shape"):
        loss(np.zeros((3, 4), dtype=int), z)
    with pytest.raises(TypeError, match="integer"):
        loss(np.array([0.5, 1.0, 2.0]), z)
    with pytest.raises(TypeError):
        loss(np.array(["a", "b", "c"]), z)
    # integral floats and (B, 1) labels are accepted, as Keras does
    assert loss(np.array([[0.0], [1.0], [2.0]]), z) == pytest.approx(loss(np.array([0, 1, 2]), z))


# ------------------------------------------------------------------------ categorical
def test_categorical_cce(torch, rng):
    z = rng.standard_normal((5, 4))
    y = np.eye(4)[rng.integers(0, 4, 5)]
    loss = losses.CategoricalCrossentropy(from_logits=True)
    value, _ = check_grad(loss, y, z)
    soft = probs(rng, (5, 4))  # soft targets
    check_grad(loss, soft, z)
    p = probs(rng, (5, 4))
    v2, _ = check_grad(losses.CategoricalCrossentropy(), y, p)
    assert v2 == pytest.approx(-np.mean(np.sum(y * np.log(p), -1)), rel=1e-10)
    z32 = z.astype(np.float32)
    tz = torch.tensor(z32, requires_grad=True)
    tl = torch.nn.CrossEntropyLoss()(tz, torch.tensor(y.astype(np.float32)))
    tl.backward()
    v, g = loss.compute(y.astype(np.float32), z32)
    assert abs(v - tl.item()) < 1e-5
    assert_close(g, tz.grad.numpy(), atol=1e-5)


# -------------------------------------------------------------------------------- mse
def test_mse(torch, rng):
    loss = losses.MeanSquaredError()
    p, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    value, _ = check_grad(loss, y, p)
    assert value == pytest.approx(np.mean((p - y) ** 2), rel=1e-12)
    p32, y32 = p.astype(np.float32), y.astype(np.float32)
    tp = torch.tensor(p32, requires_grad=True)
    tl = torch.nn.MSELoss()(tp, torch.from_numpy(y32))
    tl.backward()
    v, g = loss.compute(y32, p32)
    assert abs(v - tl.item()) < 1e-5
    assert_close(g, tp.grad.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="does not match"):
        loss(np.zeros((4, 2)), p)


# --------------------------------------------------------------------- sample weights
@pytest.mark.parametrize("make,kind", [
    (lambda: losses.BinaryCrossentropy(from_logits=True), "binary"),
    (lambda: losses.MeanSquaredError(), "regression"),
    (lambda: losses.SparseCategoricalCrossentropy(from_logits=True), "sparse"),
    (lambda: losses.CategoricalCrossentropy(from_logits=True), "onehot"),
])
def test_sample_weight(make, kind, rng):
    loss = make()
    B = 6
    z = rng.standard_normal((B, 3))
    y = {"binary": (rng.random((B, 3)) > 0.5) * 1.0, "regression": rng.standard_normal((B, 3)),
         "sparse": rng.integers(0, 3, B), "onehot": np.eye(3)[rng.integers(0, 3, B)]}[kind]
    sw = rng.uniform(0, 2, B)
    value, _ = check_grad(loss, y, z, sample_weight=sw)
    # Keras' sum_over_batch_size: the weighted sum divided by the number of elements
    per_sample = np.array([loss(y[i:i + 1], z[i:i + 1]) for i in range(B)])
    assert value == pytest.approx(np.sum(sw * per_sample) / B, rel=1e-10)
    # zero weights remove samples; weights of one change nothing
    assert loss(y, z, sample_weight=np.ones(B)) == pytest.approx(loss(y, z), rel=1e-12)
    with pytest.raises(ValueError, match="sample_weight"):
        loss(y, z, sample_weight=np.ones(B + 1))


def test_loss_bad_inputs():
    bce = losses.BinaryCrossentropy()
    with pytest.raises(TypeError, match="floating"):
        bce(np.zeros((2, 1)), np.zeros((2, 1), dtype=np.int32))
    with pytest.raises(ValueError, match="empty"):
        bce(np.zeros((0, 1)), np.zeros((0, 1)))
    with pytest.raises(ValueError, match="does not match"):
        bce(np.zeros((3, 1)), np.zeros((2, 1)))
    with pytest.raises(TypeError):
        bce(np.array([["a"], ["b"]]), np.zeros((2, 1)))


def test_get_and_serialize():
    for name in ("binary_crossentropy", "sparse_categorical_crossentropy", "categorical_crossentropy", "mse"):
        loss = losses.get(name)
        clone = losses.get(losses.serialize(loss))
        assert type(clone) is type(loss) and clone.get_config() == loss.get_config()
    ig = losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0)
    assert losses.get(losses.serialize(ig)).ignore_index == 0
    with pytest.raises(ValueError):
        losses.get("nope")


@pytest.mark.parametrize("mask, error", [(np.array([[0.5, 1.0]]), TypeError), (np.array([[1.0, 0.0]]), TypeError),
                                         (np.array([[2, 1]]), ValueError), (np.array([[-1, 1]]), ValueError)])
def test_losses_take_masks_by_the_one_mask_rule(mask, error):
    """Bool or 0/1 integers, as every layer's mask (attnx.masking): a float mask is refused, not read as weights."""
    y_true, y_pred = np.ones((1, 2)), np.full((1, 2), 0.5)
    with pytest.raises(error, match="mask"):
        losses.MeanSquaredError()(y_true, y_pred, mask=mask)
    assert losses.MeanSquaredError()(y_true, y_pred, mask=np.array([[1, 0]])) == \
        losses.MeanSquaredError()(y_true, y_pred, mask=np.array([[True, False]]))
