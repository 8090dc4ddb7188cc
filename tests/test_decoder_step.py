"""The one transformer decoder step: `TransformerDecoder.step` / `TransformerDecoderLayer.step` over a
`DecoderCache` (one C++ call per position for every layer, `decoder_step.hpp`), used by the
`Transformer` translator; the one validation boundary of masks and head counts on that path.

The cached step equals the layer's own causal forward at every position (outputs and the last
layer's cross-attention weights, float32 and float64, both norm orders, padded and fully masked
memory rows); the translator's step logits equal its teacher-forced logits and its greedy
translations a plain argmax that re-runs the whole model; a source mask is checked at most once per
public call; `num_heads=2.5` is an error everywhere; and no second implementation of the decoder
layer can appear without a test failing."""
import pathlib
import re
import sys

import numpy as np
import pytest

import attnx
from attnx import layers
from attnx.layers.transformer import DecoderCache
from attnx.seq2seq import Transformer
from attnx.testing import assert_close

PACKAGE = pathlib.Path(attnx.__file__).parent


def rand(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def perturbed(layer, seed=3):
    """Non-trivial biases and norms: every weight moved off its initial value."""
    rng = np.random.default_rng(seed)
    for p in layer.params.values():
        p += (rng.standard_normal(p.shape) * 0.3).astype(p.dtype)
    return layer


def memory_mask(N, S):
    mask = np.ones((N, S), bool)
    mask[0, S // 2:] = False  # padded
    mask[1] = False           # nothing to attend to: zero weights, never NaN
    return mask


CONFIGS = [dict(), dict(norm_first=True), dict(activation="gelu", num_layers=1), dict(num_layers=3, num_heads=4)]


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 2e-5)])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_stack_step_equals_the_causal_forward_at_every_position(config, dtype, tol):
    config = {"num_layers": 2, "num_heads": 2, "intermediate_dim": 12, **config}
    N, T, S, D = 3, 5, 4, 8
    decoder = layers.TransformerDecoder(**config, dtype=dtype)
    target, memory = rand(N, T, D, seed=1, dtype=dtype), rand(N, S, D, seed=2, dtype=dtype)
    mask = memory_mask(N, S)
    decoder([target, memory])
    perturbed(decoder)
    (full, _, cross), _ = decoder.apply([target, memory], encoder_padding_mask=mask, return_attention_scores=True)
    cache = decoder.start_cache(memory, mask, capacity=2)  # grows twice on the way
    for t in range(T):
        y, cache, weights = decoder.step(target[:, t], cache, return_attention_scores=True)
        assert y.dtype == np.dtype(dtype) and cache.length == t + 1
        assert_close(y, full[:, t], atol=tol, what=f"output at position {t}")
        assert_close(weights, cross[-1][:, :, t], atol=tol, what=f"cross-attention weights at position {t}")
    assert np.all(weights[1] == 0) and np.isfinite(y).all()
    assert cache.keys.shape[:2] == (config["num_layers"], N) and cache.keys.shape[2] >= T


def test_stack_step_equals_the_forward_at_every_simd_level(level):
    """float32 on each SIMD level the CPU has, sizes that leave vector tails (D 24, 3 heads of 8)."""
    N, T, S, D = 5, 4, 7, 24
    decoder = layers.TransformerDecoder(2, 3, 40, activation="gelu", dtype="float32")
    target, memory = rand(N, T, D, seed=11, dtype=np.float32), rand(N, S, D, seed=12, dtype=np.float32)
    decoder([target, memory])
    perturbed(decoder)
    mask = memory_mask(N, S)
    full, _ = decoder.apply([target, memory], encoder_padding_mask=mask)
    cache = decoder.start_cache(memory, mask)
    for t in range(T):
        y, cache, _ = decoder.step(target[:, t], cache)
        assert_close(y, full[:, t], atol=3e-5, what=f"{level} position {t}")


def test_layer_step_equals_the_layer_forward():
    N, T, S, D = 2, 4, 3, 6
    layer = layers.TransformerDecoderLayer(3, 10, dtype="float64")
    target, memory = rand(N, T, D, seed=4), rand(N, S, 5, seed=5)  # a memory of another width
    layer([target, memory])
    perturbed(layer)
    full, _ = layer.apply([target, memory], encoder_padding_mask=np.array([3, 2]))
    cache = layer.start_cache(memory, np.array([3, 2]))
    for t in range(T):
        y, cache, _ = layer.step(target[:, t], cache)
        assert_close(y, full[:, t], atol=1e-12, what=f"position {t}")


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_step_equals_the_causal_forward(norm_first):
    """The same step for encoder layers run causally (a decoder-only model): no cross-attention."""
    N, T, D = 3, 5, 8
    x = rand(N, T, D, seed=8)
    for stack in (layers.TransformerEncoder(2, 2, 12, norm_first=norm_first, dtype="float64"),
                  layers.TransformerEncoderLayer(2, 12, norm_first=norm_first, dtype="float64")):
        stack(x)
        perturbed(stack)
        full, _ = stack.apply(x, use_causal_mask=True)
        cache = stack.start_cache(N, capacity=3)
        for t in range(T):
            y, cache = stack.step(x[:, t], cache)
            assert_close(y, full[:, t], atol=1e-12, what=f"{type(stack).__name__} position {t}")


def test_selected_rows_continue_as_their_own_decoding():
    N, T, S, D = 4, 3, 5, 8
    decoder = layers.TransformerDecoder(2, 2, 12, dtype="float64")
    target, memory = rand(N, T, D, seed=6), rand(N, S, D, seed=7)
    decoder([target, memory])
    perturbed(decoder)
    full, _ = decoder.apply([target, memory])
    cache = decoder.start_cache(memory, capacity=1)
    decoder.step(target[:, 0], cache)
    rows = np.array([3, 1, 1])
    picked = cache.select(rows)
    for t in range(1, T):
        y, picked, _ = decoder.step(target[rows, t], picked)
        assert_close(y, full[rows, t], atol=1e-12, what=f"selected rows at position {t}")
    # the original cache is untouched by the selected one's steps
    y, cache, _ = decoder.step(target[:, 1], cache)
    assert_close(y, full[:, 1], atol=1e-12, what="the original rows")


@pytest.mark.parametrize("kwargs", [{}, {"norm_first": True, "positions": "learned", "tie_output": True}])
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 5e-5)])
def test_translator_step_logits_equal_the_teacher_forced_logits(kwargs, dtype, tol):
    model = perturbed(Transformer(11, 13, model_dim=8, num_heads=2, intermediate_dim=16, num_encoder_layers=2,
                                  num_decoder_layers=2, dropout=0.0, start_token=1, end_token=2, max_length=6,
                                  dtype=dtype, **kwargs))
    rng = np.random.default_rng(1)
    source, target = rng.integers(3, 11, (3, 5)), rng.integers(3, 13, (3, 6))
    source[1, 3:] = 0
    target[:, 0] = 1
    full, _ = model.forward([source, target])
    memory, source_mask, _ = model._encode(source)
    state = model.start_state(memory, source_mask, capacity=2)
    for t in range(target.shape[1]):
        logits, state, _ = model.step(target[:, t], t, state)
        assert_close(logits, full[:, t], atol=tol, what=f"logits at position {t}")


def test_greedy_translations_equal_a_plain_argmax_over_the_whole_model():
    model = perturbed(Transformer(11, 13, model_dim=8, num_heads=2, intermediate_dim=16, num_encoder_layers=2,
                                  num_decoder_layers=2, dropout=0.0, start_token=1, end_token=2, max_length=7,
                                  dtype="float32"), seed=5)
    rng = np.random.default_rng(2)
    source = rng.integers(3, 11, (6, 5))
    source[2, 2:] = 0
    tokens, scores, attention = model.greedy_decode(source)
    for b in range(len(source)):
        prefix = [model.start_id]
        for _ in range(model.max_length):
            logits, _ = model.forward([source[b:b + 1], np.array([prefix])])
            prefix.append(int(logits[0, -1].argmax()))
            if prefix[-1] == model.end_id:
                break
        assert tokens[b, :len(prefix) - 1].tolist() == prefix[1:], f"sentence {b}"
    assert np.isfinite(scores).all() and attention.shape[:2] == (6, 2)


def test_step_refuses_a_wrong_cache_or_position():
    decoder = layers.TransformerDecoder(2, 2, 12)
    target, memory = rand(2, 3, 8), rand(2, 4, 8)
    decoder([target, memory])
    cache = decoder.start_cache(memory)
    with pytest.raises(ValueError, match=r"`cache` expected the DecoderCache of 2 layer\(s\) and 3 rows"):
        decoder.step(rand(3, 8), cache)
    with pytest.raises(ValueError, match="`x`"):
        decoder.step(rand(2, 7), cache)
    with pytest.raises(ValueError, match="`capacity` must be a positive integer"):
        decoder.start_cache(memory, capacity=0)
    with pytest.raises(ValueError, match=r"encoder_padding_mask.*shape"):
        decoder.start_cache(memory, np.ones((2, 5), bool))
    model = Transformer(11, 13, model_dim=8, num_heads=2, intermediate_dim=16, num_encoder_layers=1,
                        num_decoder_layers=1, start_token=1, end_token=2)
    memory, mask, _ = model._encode(np.array([[3, 4]]))
    with pytest.raises(ValueError, match="next position is 0, got position=1"):
        model.step(np.array([1]), 1, model.start_state(memory, mask))


def test_the_binding_checks_what_the_kernel_reads():
    kernels = attnx.kernels
    decoder = layers.TransformerDecoder(1, 2, 12, dtype="float32")
    memory = rand(2, 4, 8, dtype=np.float32)
    decoder([rand(2, 3, 8, dtype=np.float32), memory])
    cache = decoder.start_cache(memory)
    args = dict(x=rand(2, 8, dtype=np.float32), self_keys=cache.keys, self_values=cache.values,
                cross_keys=cache.cross_keys, cross_values=cache.cross_values, source_mask=None, position=0,
                weights=cache.layer_weights, num_heads=2, norm_first=False, epsilon=1e-5, activation="relu")
    kernels.decoder_stack_step(**args)
    for change, pattern in [({"position": 16}, "position must be in"), ({"num_heads": 3}, "num_heads must divide"),
                            ({"weights": []}, "one list per layer"),
                            ({"weights": [cache.layer_weights[0][:-1]]}, "22 arrays"),
                            ({"x": rand(2, 16, dtype=np.float32)[:, ::2]}, "x: expected a C-contiguous array"),
                            ({"self_keys": cache.keys.astype(np.float64)}, "self_keys: expected dtype float32"),
                            ({"source_mask": np.ones((2, 3), bool)}, r"source_mask: expected shape \(2, 4\)"),
                            ({"cross_keys": cache.cross_keys[:, :1]}, "cross_keys: expected shape")]:
        with pytest.raises((ValueError, TypeError), match=pattern):
            kernels.decoder_stack_step(**{**args, **change})
    weights = [list(cache.layer_weights[0])]
    weights[0][2] = np.zeros((8, 7), np.float32)
    with pytest.raises(ValueError, match="layer 0 self query kernel: expected shape"):
        kernels.decoder_stack_step(**{**args, "weights": weights})


# ----------------------------------------------------------------------------- one validation boundary
@pytest.fixture
def mask_checks(monkeypatch):
    """Counts the mask checks (`attnx.masking.as_mask` on a mask, wherever it was imported)."""
    import attnx.masking
    original, calls = attnx.masking.as_mask, []

    def counted(mask, *args, **kwargs):
        if mask is not None:
            calls.append(args[2] if len(args) > 2 else kwargs.get("where"))
        return original(mask, *args, **kwargs)
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("attnx") and getattr(module, "as_mask", None) is original:
            monkeypatch.setattr(module, "as_mask", counted)
    return calls


def test_a_source_mask_is_checked_at_most_once_per_public_call(mask_checks):
    model = Transformer(11, 13, model_dim=8, num_heads=2, intermediate_dim=16, num_encoder_layers=3,
                        num_decoder_layers=3, start_token=1, end_token=2, max_length=5)
    source = np.array([[3, 4, 5, 0], [6, 7, 0, 0]])
    target = np.array([[1, 3, 4], [1, 5, 0]])
    for call in (lambda: model.forward([source, target]), lambda: model.forward([source, target], training=True),
                 lambda: model.greedy_decode(source), lambda: model.beam_search(source, width=2)):
        mask_checks.clear()
        call()
        assert len(mask_checks) <= 1, mask_checks
    decoder = layers.TransformerDecoder(3, 2, 12)
    target, memory = rand(2, 3, 8), rand(2, 4, 8)
    for padding in (np.array([4, 2]), np.ones((2, 4), bool)):
        mask_checks.clear()
        decoder.apply([target, memory], encoder_padding_mask=padding, training=True)
        assert len(mask_checks) == 1 and mask_checks[0].endswith("`encoder_padding_mask`"), mask_checks
    encoder = layers.TransformerEncoder(3, 2, 12)
    mask_checks.clear()
    encoder.apply(target, padding_mask=np.array([3, 1]), training=True)
    assert len(mask_checks) == 1, mask_checks


@pytest.mark.parametrize("bad", [2.5, True, 0, -2, "2", np.float64(2.0)])
def test_num_heads_must_be_a_positive_integer_everywhere(bad):
    makers = [lambda: layers.MultiHeadAttention(bad, 4), lambda: layers.TransformerEncoderLayer(bad, 8),
              lambda: layers.TransformerDecoderLayer(bad, 8), lambda: layers.TransformerEncoder(2, bad, 8),
              lambda: layers.TransformerDecoder(2, bad, 8),
              lambda: Transformer(11, 13, model_dim=8, num_heads=bad, start_token=1, end_token=2)]
    for make in makers:
        with pytest.raises(ValueError, match=r"`num_heads` must be a positive integer"):
            make()


def test_num_heads_must_divide_the_model_size():
    with pytest.raises(ValueError, match="embedding size 8 is not divisible by num_heads=3"):
        Transformer(11, 13, model_dim=8, num_heads=3, start_token=1, end_token=2)
    with pytest.raises(ValueError, match="embedding size 6 is not divisible by num_heads=4"):
        layers.TransformerDecoder(2, 4, 8)([rand(2, 3, 6), rand(2, 4, 6)])


# ----------------------------------------------------------------------------- one implementation
def _sources():
    return {path.relative_to(PACKAGE).as_posix(): path.read_text() for path in PACKAGE.rglob("*.py")}


def test_the_decoder_layer_has_one_implementation():
    """The decoder layer's structure lives in layers/transformer.py: no other module reaches into a
    layer's sublayers (the ONNX export reads `residual_blocks()`), composes attention with heads
    itself, or runs the cached step kernel."""
    sublayers = re.compile(r"\.(norm[123]|self_attention|cross_attention)\b")
    for name, source in _sources().items():
        if name == "layers/transformer.py":
            continue
        # interop maps weights between the same-named sublayers of torch's and attnx's layers, the
        # CTranslate2 export fills CTranslate2's spec fields of those names (from residual_blocks())
        assert name.startswith("interop/") or name == "export/ctranslate2.py" or not sublayers.search(source), \
            f"{name} reaches into a transformer layer's sublayers"
        assert not re.search(r"scaled_dot_product_attention\([^)]*heads=", source, re.S) or name in (
            "layers/attention.py", "ops.py"), f"{name} runs multi-head attention itself"
        assert "decoder_stack_step" not in source or name == "kernels.py", f"{name} runs the cached step"
        assert "class DecoderCache" not in source and "_StepState" not in source, f"{name} has its own decoder cache"
    blocks = layers.TransformerDecoderLayer(2, 8)
    blocks([rand(1, 2, 4), rand(1, 3, 4)])
    assert [kind for kind, _, _ in blocks.residual_blocks()] == ["self_attention", "cross_attention", "feed_forward"]
    assert len(blocks.step_weights()) == 22
    assert isinstance(blocks.start_cache(rand(1, 3, 4)), DecoderCache)
