"""The transformer translation model (`attnx.seq2seq.Transformer`), its training recipe (label
smoothing, Noam warm-up); the subword tokenizer's tests are in test_subwords.py.

Parity of the model's logits and gradients with PyTorch's nn.Transformer on the same weights, a
float64 gradient check, cached incremental decoding equal to the teacher-forced decoder, beam
width 1 equal to greedy, beam search equal to a plain NumPy beam search that re-runs the whole
decoder, save / load, bad input, and training on the Marathi pairs to a stated BLEU."""
import numpy as np
import pytest

import attnx
from attnx import losses, optimizers
from attnx.interop import to_torch
from attnx.seq2seq import Transformer
from attnx.translation import LengthBuckets
from attnx.testing import assert_close, gradcheck

CORPUS = ["the cat sat on the mat .", "the dog sat on the log .", "a cat and a dog .", "the cats sat .",
          "मी घरी जातो .", "तो घरी जातो .", "ती शाळेत जाते ."]


def small_model(dtype="float64", **kwargs):
    config = dict(model_dim=8, num_heads=2, intermediate_dim=16, num_encoder_layers=2, num_decoder_layers=2,
                  dropout=0.0, start_token=1, end_token=2, max_length=6, dtype=dtype)
    config.update(kwargs)
    model = Transformer(11, 13, **config)
    rng = np.random.default_rng(3)
    for p in model.params.values():  # non-trivial biases and norms
        p += (rng.standard_normal(p.shape) * 0.3).astype(p.dtype)
    return model


def batch(seed=0, B=3, S=5, T=4, source_vocab=11, target_vocab=13):
    rng = np.random.default_rng(seed)
    source = rng.integers(3, source_vocab, (B, S))
    source[1, 3:] = 0  # padding
    target = rng.integers(3, target_vocab, (B, T))
    target[:, 0] = 1
    target[-1, 2:] = 0
    return source, target


# ----------------------------------------------------------------------------- recipe pieces
@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_label_smoothing_matches_torch_cross_entropy(torch, epsilon):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 4, 7))
    labels = rng.integers(0, 7, (3, 4))
    labels[0, :2] = 0  # ignored (padding)
    loss = losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0, label_smoothing=epsilon)
    value, grad = loss.compute(labels, logits)
    t = torch.tensor(logits, requires_grad=True)
    want = torch.nn.functional.cross_entropy(t.reshape(-1, 7), torch.tensor(labels).reshape(-1), ignore_index=0,
                                             label_smoothing=epsilon)
    want.backward()
    assert abs(value - want.item()) < 1e-12
    assert_close(grad, t.grad.numpy(), atol=1e-12, what="d loss / d logits")
    assert losses.get(losses.serialize(loss)).label_smoothing == epsilon
    per_token = losses.SparseCategoricalCrossentropy(from_logits=True, label_smoothing=epsilon, reduction="none")
    want = torch.nn.functional.cross_entropy(torch.tensor(logits).reshape(-1, 7), torch.tensor(labels).reshape(-1),
                                             label_smoothing=epsilon, reduction="none")
    assert_close(per_token(labels, logits), want.reshape(3, 4).numpy(), atol=1e-12, what="reduction 'none'")


def test_label_smoothing_needs_logits_and_a_rate_below_one():
    with pytest.raises(ValueError, match="from_logits"):
        losses.SparseCategoricalCrossentropy(label_smoothing=0.1)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        losses.SparseCategoricalCrossentropy(from_logits=True, label_smoothing=1.0)


def test_noam_decay_warms_up_linearly_then_decays_as_inverse_square_root():
    schedule = optimizers.NoamDecay(model_dim=256, warmup_steps=100, scale=2.0)
    peak = 2.0 * (256 * 100) ** -0.5
    assert abs(schedule(99) - peak) < 1e-15  # step 99 is the 100th update
    assert abs(schedule(0) - peak / 100) < 1e-15
    assert abs(schedule(399) - peak / 2) < 1e-15  # 400 = 4 x warm-up: half the peak
    adam = optimizers.Adam(schedule)
    again = optimizers.get(optimizers.serialize(adam))
    assert again.learning_rate(399) == schedule(399)
    with pytest.raises(ValueError, match="positive"):
        optimizers.NoamDecay(256, warmup_steps=0)


# ----------------------------------------------------------------------------- the model
def torch_twin(torch, model):
    """nn.Transformer with the model's weights (attnx's converters for the stacks and norms), the
    embeddings and the output projection around it."""
    D = model.model_dim
    config = model.stack_config
    net = torch.nn.Transformer(D, config["num_heads"], model.encoder.num_layers, model.decoder.num_layers,
                               config["intermediate_dim"], dropout=0.0, batch_first=True,
                               norm_first=config["norm_first"]).double()
    net.encoder.layers = to_torch(model.encoder).double().layers
    net.decoder.layers = to_torch(model.decoder).double().layers
    net.encoder.norm = to_torch(model.encoder_norm).double()
    net.decoder.norm = to_torch(model.decoder_norm).double()
    source_table = torch.tensor(model.source_embedding.params["embeddings"], requires_grad=True)
    target_table = source_table if model.shared_embeddings else torch.tensor(
        model.target_embedding.params["embeddings"], requires_grad=True)
    output = None if model.tie_output else (torch.tensor(model.output_projection.params["kernel"], requires_grad=True),
                                            torch.tensor(model.output_projection.params["bias"], requires_grad=True))

    def sinusoid(T):
        position = np.arange(T)[:, None]
        i = np.arange(D)[None, :]
        angle = position / 10000.0 ** (2 * (i // 2) / D)
        return torch.tensor(np.where(i % 2 == 0, np.sin(angle), np.cos(angle)))

    def run(source, target_in):
        src, tgt = torch.tensor(source), torch.tensor(target_in)
        x = source_table[src] * D ** 0.5 + sinusoid(src.shape[1])
        y = target_table[tgt] * D ** 0.5 + sinusoid(tgt.shape[1])
        causal = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=torch.float64)
        h = net(x, y, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src == 0,
                memory_key_padding_mask=src == 0)
        return h @ target_table.T if output is None else h @ output[0] + output[1]
    return run, source_table, target_table, output


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("norm_first,shared,tied", [(False, False, False), (True, True, True), (False, True, False)],
                         ids=["post-norm", "pre-norm-shared-tied", "shared"])
def test_forward_and_gradients_match_torch_nn_transformer(torch, norm_first, shared, tied):
    model = Transformer(13 if shared else 11, 13, model_dim=8, num_heads=2, intermediate_dim=16,
                        num_encoder_layers=2, num_decoder_layers=2, dropout=0.0, start_token=1, end_token=2,
                        max_length=6, norm_first=norm_first, shared_embeddings=shared, tie_output=tied,
                        dtype="float64")
    rng = np.random.default_rng(3)
    for p in model.params.values():
        p += rng.standard_normal(p.shape) * 0.3
    source, target = batch()
    run, source_table, target_table, output = torch_twin(torch, model)
    (x, target_in), target_out = model.train_data(source, target)
    logits, cache = model.forward([x, target_in], training=True)
    want = run(x, target_in)
    assert_close(logits, want.detach().numpy(), atol=1e-10, what="logits")
    upstream = rng.standard_normal(logits.shape)
    model.zero_grad()
    model.backprop(cache, upstream)
    (want * torch.tensor(upstream)).sum().backward()
    assert_close(model.target_embedding.grads["embeddings"], target_table.grad.numpy(), atol=1e-10,
                 what="target embedding gradient")
    if not shared:
        assert_close(model.source_embedding.grads["embeddings"], source_table.grad.numpy(), atol=1e-10,
                     what="source embedding gradient")
    if not tied:
        assert_close(model.output_projection.grads["kernel"], output[0].grad.numpy(), atol=1e-10,
                     what="output kernel gradient")


@pytest.mark.parametrize("kwargs", [{}, {"norm_first": True, "positions": "learned", "tie_output": True}])
def test_gradcheck_float64(kwargs):
    model = small_model(**kwargs)
    source, target = batch(B=2, S=3, T=3)
    gradcheck(model, [source, target], max_elements=6)


@pytest.mark.parametrize("kwargs", [{}, {"norm_first": True}, {"positions": "learned", "tie_output": True}],
                         ids=["post-norm", "pre-norm", "learned-tied"])
def test_cached_incremental_decoding_equals_the_full_decoder(kwargs):
    model = small_model(**kwargs)
    source, target = batch(seed=1, T=6)
    target[2, 2:] = 5  # no padding: every position is compared
    full, _ = model.forward([source, target])
    memory, source_mask, _ = model._encode(source)
    state = model.start_state(memory, source_mask)
    for t in range(target.shape[1]):
        logits, state, _ = model.step(target[:, t], t, state)
        assert_close(logits, full[:, t], atol=1e-12, what=f"logits at position {t}")
    assert state.length == target.shape[1] and state.keys.shape[:2] == (2, 3)  # 2 decoder layers, 3 rows


def reference_beam_search(model, source, width, alpha, max_length):
    """Beam search for one sentence, written plainly: every step re-runs the whole teacher-forced
    decoder on each hypothesis (no cache); a finished hypothesis extends with padding at no cost."""
    beams = [([model.start_id], 0.0, False)]
    for _ in range(max_length):
        candidates = []
        for tokens, score, done in beams:
            if done:
                candidates.append((tokens + [0], score, True))
                continue
            logits, _ = model.forward([source[None], np.array([tokens])])
            z = logits[0, -1] - logits[0, -1].max()
            logp = z - np.log(np.exp(z).sum())
            candidates += [(tokens + [v], score + logp[v], v == model.end_id) for v in range(len(logp))]
        # stable on (beam, token) order as the batched search
        beams = sorted(candidates, key=lambda c: -c[1])[:width]
        if all(done for _, _, done in beams):
            break
    out = []
    for tokens, score, _ in beams:
        seq = [t for t in tokens[1:] if t]
        n = len(seq)
        if seq and seq[-1] == model.end_id:
            seq = seq[:-1]
        out.append((seq, score / ((5.0 + n) / 6.0) ** alpha))
    return sorted(out, key=lambda h: -h[1])


@pytest.mark.parametrize("width,alpha", [(1, 0.0), (3, 0.0), (4, 0.6)])
def test_beam_search_equals_a_plain_beam_search(width, alpha):
    attnx.set_random_seed(0)
    model = small_model(end_token=4)
    model.output_projection.params["kernel"] *= 3  # peaked: hypotheses end at different steps (0 to 5 tokens)
    source, _ = batch(seed=2, B=4)
    found = model.beam_search(source, width=width, length_penalty=alpha, max_length=5)
    ended = set()
    for b in range(len(source)):
        want = reference_beam_search(model, source[b][source[b] != 0], width, alpha, 5)
        got = [(h.tokens, h.score) for h in found[b]]
        assert [g[0] for g in got] == [w[0] for w in want]
        assert_close([g[1] for g in got], [w[1] for w in want], atol=1e-9, what=f"scores of sentence {b}")
        ended.update(len(h.tokens) for h in found[b])
        for h in found[b]:  # a row per step: the tokens, and the end token unless cut at max_length
            assert h.attention.shape == (2, len(h.tokens) + (len(h.tokens) < 5), source.shape[1])
    assert len(ended) > 1


def test_beam_width_one_equals_greedy():
    attnx.set_random_seed(0)
    model = small_model(end_token=4)
    model.output_projection.params["kernel"] *= 3
    source, _ = batch(seed=2, B=5)
    tokens, scores, attention = model.greedy_decode(source)
    for b, hyps in enumerate(model.beam_search(source, width=1)):
        row = tokens[b].tolist()
        row = row[:row.index(4)] if 4 in row else row
        assert hyps[0].tokens == row
        assert abs(hyps[0].score - scores[b]) < 1e-9
        assert_close(hyps[0].attention, attention[b, :, :len(row) + 1], atol=1e-12, what="attention")


# ----------------------------------------------------------------------------- texts, save, bad input
@pytest.fixture(scope="module")
def text_model():
    attnx.set_random_seed(0)
    model = Transformer.from_texts(CORPUS, CORPUS[::-1], vocab_size=80, model_dim=16, num_heads=2,
                                   intermediate_dim=32, num_encoder_layers=1, num_decoder_layers=1, max_length=12)
    model.compile(warmup_steps=10)
    model.fit_texts(CORPUS, CORPUS[::-1], epochs=2, batch_size=4, verbose=0)
    return model


def test_text_api_translates_in_input_order_and_sorting_changes_nothing(text_model):
    assert text_model.source_tokenizer is text_model.target_tokenizer and text_model.shared_embeddings
    batch_results = text_model.translate_batch(CORPUS, width=2, batch_size=3)
    for sentence, hyp in zip(CORPUS, batch_results):
        alone = text_model.translate_batch([sentence], width=2)[0]
        assert hyp.tokens == alone.tokens and abs(hyp.score - alone.score) < 1e-4
    translation, attention = text_model.translate("<start> the cat sat . <end>")
    assert isinstance(translation, str)
    pieces = text_model.source_tokenizer.tokenize("the cat sat .")
    # a row per generated subword and the end token unless max_length cut the translation (re-tokenizing
    # the text may segment it otherwise)
    generated = text_model.translate_batch(["<start> the cat sat . <end>"])[0].tokens
    assert text_model.target_tokenizer.decode(generated) == translation
    assert attention.shape == (min(len(generated) + 1, text_model.max_length), len(pieces))
    score = text_model.evaluate_bleu(CORPUS, CORPUS[::-1], scorer="attnx")
    assert 0.0 <= score <= 1.0


def test_save_load_round_trip_translates_identically(text_model, tmp_path):
    path = tmp_path / "t.attnx"
    text_model.save(path)
    loaded = attnx.load_model(path)
    assert isinstance(loaded, Transformer) and loaded.source_tokenizer is loaded.target_tokenizer
    for a, b in zip(text_model.translate_batch(CORPUS, width=3), loaded.translate_batch(CORPUS, width=3)):
        assert a.tokens == b.tokens
    assert loaded.optimizer.learning_rate(5) == text_model.optimizer.learning_rate(5)
    assert loaded.loss_functions[0].label_smoothing == 0.1


def test_bad_input_raises_clear_errors(text_model):
    with pytest.raises(ValueError, match="empty sentence"):
        text_model.translate("<start> <end>")
    with pytest.raises(ValueError, match="width"):
        text_model.translate("the cat", width=0)
    with pytest.raises(ValueError, match="width"):
        text_model.translate("the cat", width=text_model.target_vocab_size + 1)
    with pytest.raises(TypeError, match="str"):
        text_model.translate(3)
    translation, _ = text_model.translate("the \u263a cat")  # an unknown character: <unk>, no error
    assert isinstance(translation, str)
    with pytest.raises(ValueError, match="max_positions"):
        Transformer(10, 10, positions="learned", max_positions=8, max_length=20)
    learned = small_model(positions="learned", max_positions=6)
    with pytest.raises(ValueError, match="max_positions"):
        learned.greedy_decode(np.ones((1, 7), dtype=np.int64))
    with pytest.raises(ValueError, match="shared_embeddings"):
        Transformer(10, 12, shared_embeddings=True)
    with pytest.raises(ValueError, match="divisible"):
        Transformer(10, 12, model_dim=10, num_heads=4)
    with pytest.raises(IndexError, match="out of range"):
        small_model().greedy_decode(np.array([[3, 11]]))
    with pytest.raises(ValueError, match="start token"):
        small_model().train_data(np.array([[3, 4]]), np.array([[5, 6]]))


# ----------------------------------------------------------------------------- training
def test_length_buckets_cover_every_pair_once_with_little_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, 1000)
    source = (np.arange(30)[None, :] < lengths[:, None]) * (np.arange(1000)[:, None] + 1)  # row i holds i + 1
    target = source[:, :20].copy()
    target[:, 0] = 1
    buckets = LengthBuckets(source, target, batch_size=16, window=20)
    batches = list(buckets)
    assert len(batches) == len(buckets) == 63
    seen = np.sort(np.concatenate([s[:, 0] for s, _ in batches]))
    assert (seen == np.arange(1, 1001)).all()
    waste = (lambda ids: 1 - (ids != 0).sum() / (len(ids) * (ids != 0).sum(axis=1).max()))  # after trimming
    assert np.mean([waste(t) for _, t in batches]) < 0.1
    assert np.mean([waste(s) for s, _ in batches]) < 0.1
    assert np.mean([waste(source[i:i + 16]) for i in range(0, 1000, 16)]) > 0.3  # unsorted rows
    attnx.set_random_seed(5)
    first = [s[:, 0].tolist() for s, _ in buckets]
    attnx.set_random_seed(5)
    assert first == [s[:, 0].tolist() for s, _ in buckets]
    assert first != [s[:, 0].tolist() for s, _ in buckets]  # a new order each pass


def test_learns_marathi_pairs_to_a_bleu():
    """320 short English -> Marathi pairs (the first translation of each sentence, so that a perfect
    score is possible), learned by heart in 300 steps: the training set's sacreBLEU must pass 90
    with greedy decoding (measured 100.0 on seeds 0 and 2 with SentencePiece's BPE; 86-90 after 200 steps)."""
    attnx.set_random_seed(0)
    pairs = attnx.datasets.load_anki_pairs(max_words=3, num_examples=600, split=(1.0, 0.0, 0.0)).train
    first = dict(zip(reversed(pairs.source), reversed(pairs.target)))
    source, target = list(first), list(first.values())
    model = Transformer.from_texts(source, target, vocab_size=600, model_dim=64, num_heads=4, intermediate_dim=128,
                                   num_encoder_layers=2, num_decoder_layers=2, dropout=0.0, max_length=16)
    model.compile(optimizers.Adam(optimizers.NoamDecay(64, warmup_steps=50, scale=0.15), beta_2=0.98))
    model.fit_texts(source, target, epochs=30, batch_size=32, verbose=0)
    bleu = model.evaluate_bleu(source, target, scorer="sacrebleu")
    assert bleu > 0.9, f"training-set BLEU {100 * bleu:.1f}"


@pytest.mark.parametrize("arg, bound", [("source_vocab_size", 2 ** 22), ("model_dim", 16384),
                                        ("intermediate_dim", 65536), ("num_encoder_layers", 256),
                                        ("num_decoder_layers", 256), ("max_positions", 8192), ("max_length", 1024)])
def test_every_size_a_file_sets_is_bounded(arg, bound):
    config = dict(source_vocab_size=11, target_vocab_size=13, model_dim=8, num_heads=2, intermediate_dim=16,
                  num_encoder_layers=1, num_decoder_layers=1, start_token=1, end_token=2)
    with pytest.raises(ValueError, match=f"`{arg}` must be <= {bound}"):
        Transformer(**{**config, arg: bound + 1})
    with pytest.raises(ValueError, match="num_layers must be an integer"):
        attnx.layers.TransformerEncoder(2.5, 2, 8)


def test_sources_are_bounded_at_max_source_length(text_model):
    limit = Transformer.MAX_SOURCE_LENGTH
    ids = np.ones((1, limit + 1), np.int64)
    with pytest.raises(ValueError, match="MAX_SOURCE_LENGTH"):
        text_model.predict(ids)
    assert text_model.encode_sources(["the cat " * 2000]).shape == (1, limit)  # a sentence is cut, not refused
    assert isinstance(text_model.translate("the cat " * 2000)[0], str)


def test_token_ids_and_tokenizers_must_fit_the_vocabularies(text_model):
    config = dict(model_dim=8, num_heads=2, intermediate_dim=16, num_encoder_layers=1, num_decoder_layers=1)
    for bad in (-2, 13, 2 ** 40, 1.5, True):
        with pytest.raises(ValueError, match="start_token"):
            Transformer(11, 13, start_token=bad, end_token=2, **config)
    tokenizer = text_model.source_tokenizer  # more ids than a vocabulary of 11
    with pytest.raises(ValueError, match="source tokenizer has"):
        Transformer(11, tokenizer.vocab_size, source_tokenizer=tokenizer, target_tokenizer=tokenizer, **config)
