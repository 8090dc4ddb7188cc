"""The transformer translation model of "Attention Is All You Need" (Vaswani et al. 2017), with the
API of the recurrent `attnx.seq2seq.Seq2Seq` (``from_texts``, ``compile``, ``fit_texts``,
``translate``, ``evaluate_bleu``), greedy and beam search over a key/value cache, and subword
vocabularies (`attnx.text.SubwordTokenizer`). `attnx.seq2seq` re-exports `Transformer`.

The model is the encoder stack, the decoder stack (causal self-attention, then attention over the
encoder's output), a final layer normalization after each (as PyTorch's ``nn.Transformer``) and a
linear layer giving the logits::

    x = dropout(E_src[source] * sqrt(D) + P),  memory = norm_enc(encoder(x, padding mask))
    y = dropout(E_tgt[target_in] * sqrt(D) + P),  h = norm_dec(decoder([y, memory], causal mask))
    logits = h W_out + b_out        (tie_output: logits = h E_tgt^T)

Training is teacher forcing as in Seq2Seq: ``fit(source ids, target ids)`` with targets that start
with the start token; `train_data` feeds ``[source, target[:, :-1]]`` and scores ``target[:, 1:]``.

Decoding runs one target position at a time, through the decoder stack's cached step
(`TransformerDecoder.step`: every layer in one C++ call). Each decoder layer keeps the keys and
values of the earlier positions of its self-attention (a `DecoderCache`, one row per step, rows
reordered with the hypotheses in beam search); the keys and values of the encoder output for the
cross-attention are projected once per sentence. A sentence leaves the batch as soon as it is
finished (greedy: its end token; beam search: all its beams ended), so the remaining steps run
on fewer rows.

Typical use::

    splits = attnx.datasets.load_anki_pairs(data_dir=..., max_words=10, raw=True)
    model = Transformer.from_texts(splits.train.source, splits.train.target, vocab_size=4000)
    model.compile()                       # Adam + NoamDecay, warm-up scaled to the run; label smoothing 0.1
    model.fit_texts(splits.train.source, splits.train.target, epochs=10)
    translation, attention = model.translate("I am hungry.")
    model.save("mar.attnx")               # attnx.load_model("mar.attnx") reads it back
"""
import logging
import math
from typing import NamedTuple

import numpy as np

from . import datasets, initializers, kernels, losses, metrics, optimizers, quantization, random, text
from .backend import unique_name
from . import decoding
from .decoding import Hypothesis, check_target_ids, positive_int as _positive_int
from .layers.core import Dense, Dropout, Embedding
from .layers.multi_head_attention import head_sizes
from .layers.normalization import LayerNormalization
from .layers.positions import PositionalEncoding, PositionEmbedding
from .layers.transformer import DecoderCache, TransformerDecoder, TransformerEncoder
from .models import Model

__all__ = ["Transformer", "Hypothesis", "LengthBuckets", "AttentionMaps", "Alignment", "subword_tokenizers",
           "translation_bleu", "word_alignment", "lexicon_cells"]


class _Cache(NamedTuple):
    source_embedding: object
    encoder: object
    encoder_norm: object
    target_embedding: object
    decoder: object
    decoder_norm: object
    output: object


def _strip_markers(sentence):
    """A sentence without the ``<start>`` / ``<end>`` markers of `attnx.datasets.preprocess_sentence`."""
    words = sentence.split()
    if words and words[0] == "<start>":
        words = words[1:]
    if words and words[-1] == "<end>":
        words = words[:-1]
    return " ".join(words)


def subword_tokenizers(sources, targets, vocab_size, shared_vocabulary):
    """(source tokenizer, target tokenizer): SentencePiece BPE vocabularies (`attnx.text.SubwordTokenizer`)
    of about `vocab_size` ids learned on the sentences as written (``<start>`` / ``<end>`` markers
    dropped), one shared by both sides (the same object twice) or one per side. `Transformer.from_texts`
    and `Seq2Seq.from_texts` build their subword models on it."""
    sources = [_strip_markers(s) for s in sources]
    targets = [_strip_markers(t) for t in targets]
    if shared_vocabulary:
        shared = text.SubwordTokenizer(vocab_size).fit_on_texts(sources + targets)
        return shared, shared
    return text.SubwordTokenizer(vocab_size).fit_on_texts(sources), text.SubwordTokenizer(vocab_size).fit_on_texts(targets)


def subword_sources(owner, tokenizer, sentences, max_subwords=None):
    """The subword ids of each source sentence (markers optional), the first `max_subwords` of each;
    a sentence that is not a str is a TypeError, one without a subword a ValueError, naming `owner`."""
    seqs = []
    for sentence in sentences:
        if not isinstance(sentence, str):
            raise TypeError(f"{owner}: sentences must be str, got {type(sentence).__name__}")
        ids = tokenizer.encode(_strip_markers(sentence))
        if not ids:
            raise ValueError(f"{owner}: empty sentence {sentence!r}")
        seqs.append(ids[:max_subwords])
    return seqs


def subword_targets(tokenizer, sentences, start_id, end_id):
    """Each target sentence (markers optional) as the start id, its subword ids, the end id."""
    return [[start_id] + tokenizer.encode(_strip_markers(s)) + [end_id] for s in sentences]


def tokenizers_from_config(config):
    """A translator's config with its tokenizers' JSON read back (the same JSON on both sides, a shared
    vocabulary, read as one tokenizer)."""
    config = dict(config)
    source, target = config.get("source_tokenizer"), config.get("target_tokenizer")
    read = (lambda js: None if js is None else text.tokenizer_from_json(js))
    config["source_tokenizer"] = read(source)
    config["target_tokenizer"] = config["source_tokenizer"] if target == source else read(target)
    return config


def translation_bleu(translations, references, normalize=False, scorer="auto"):
    """Corpus BLEU-4 of translated sentences against one reference sentence each (``<start>`` / ``<end>``
    markers never scored).

    By default the text as written, cased and detokenized, which sacreBLEU tokenizes itself (its 13a
    tokenizer): the score papers report. ``normalize=True`` scores both sides after the loader's
    normalization instead (`attnx.datasets.preprocess_sentence`: lowercased, punctuation split off),
    the score of the tutorial's preprocessed text. `scorer` as in `metrics.bleu_score` ("auto":
    sacreBLEU when installed); the returned `metrics.BleuScore` carries its signature."""
    translations, references = list(translations), list(references)
    if len(translations) != len(references):
        raise ValueError(f"evaluate_bleu: {len(translations)} translations but {len(references)} references")

    def words(sentence):
        if not isinstance(sentence, str):
            raise TypeError(f"evaluate_bleu: references must be str sentences, got {type(sentence).__name__}")
        sentence = _strip_markers(sentence)
        return (_strip_markers(datasets.preprocess_sentence(sentence)) if normalize else sentence).split()

    references, translations = [[words(r)] for r in references], [words(t) for t in translations]
    if not normalize:
        return metrics.bleu_score(references, translations, scorer)
    # normalized text is tokenized on purpose: no "you forgot to detokenize" warning from sacreBLEU
    logger = logging.getLogger("sacrebleu")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return metrics.bleu_score(references, translations, scorer)
    finally:
        logger.setLevel(level)


class Alignment(NamedTuple):
    """What `word_alignment` found: ``pairs`` the word pairs it scored, ``accuracy`` the share of them
    whose target word attends most to its source word, ``mass`` the mean weight it gives that word."""
    pairs: int
    accuracy: float
    mass: float


def _word_key(word):
    """A word as the lexicon matches it: lowercased, without the punctuation around it or an English
    possessive ("Tom's" is "tom")."""
    word = word.strip(".,;:!?\"'()[]«»¿¡।").lower()
    return word[:-2] if word.endswith(("'s", "\u2019s")) else word


def lexicon_cells(source_words, target_words, lexicon):
    """The (row, column) cells where a lexicon pair meets in one attention map (words as `word_alignment`
    takes them): a row of a target word starting with the stem, a column of its source word. For
    drawing the pairs on a heatmap."""
    pairs = [(_word_key(en), _word_key(stem)) for en, stem in lexicon]
    return [(r, c) for r, tw in enumerate(target_words) if tw is not None for c, sw in enumerate(source_words)
            if any(_word_key(sw) == en and _word_key(tw).startswith(stem) for en, stem in pairs)]


def word_alignment(examples, lexicon):
    """How well attention aligns the words of a small bilingual lexicon, over translated sentences.

    Args:
        examples: ``(source_words, target_words, weights)`` per sentence: ``weights`` (rows, columns)
            an attention matrix, ``source_words[c]`` the word column c belongs to, ``target_words[r]``
            the word row r belongs to (a word of several subwords repeats;
            `text.SubwordTokenizer.piece_words` gives them), None for rows of no word (``<end>``).
        lexicon: ``(source word, target stem)`` pairs, e.g. ``("school", "शाळ")``: a target word
            matches when it starts with the stem (case, attached punctuation and an English possessive
            ignored).
    Returns:
        `Alignment`: for every sentence whose source has a lexicon word and whose translation a word
        of its stem, the rows of that target word are averaged and summed per source word; the pair
        counts as aligned when the lexicon's source word gets the largest share.
    """
    found = hits = 0
    mass = 0.0
    for source_words, target_words, weights in examples:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (len(target_words), len(source_words)):
            raise ValueError(f"word_alignment: weights of shape {weights.shape} for {len(target_words)} target and "
                             f"{len(source_words)} source words")
        source_keys = [_word_key(w) for w in source_words]
        target_keys = [None if w is None else _word_key(w) for w in target_words]
        per_word = {}
        for column, key in enumerate(source_keys):
            per_word.setdefault(key, []).append(column)
        for source_word, stem in lexicon:
            source_word, stem = _word_key(source_word), _word_key(stem)
            if source_word not in per_word:
                continue
            for target_word in dict.fromkeys(k for k in target_keys if k and k.startswith(stem)):
                rows = [r for r, k in enumerate(target_keys) if k == target_word]
                row = weights[rows].mean(axis=0)
                shares = {key: row[columns].sum() for key, columns in per_word.items()}
                found += 1
                hits += max(shares, key=shares.get) == source_word
                mass += shares[source_word]
    return Alignment(found, hits / found if found else float("nan"), mass / found if found else float("nan"))


class AttentionMaps(NamedTuple):
    """A translation and its cross-attention (`Transformer.attention_maps`): ``weights`` (layers, heads,
    rows, columns), a row per target piece and the end token (``target_pieces`` ends with "<end>",
    unless max_length cut the translation), a column per source piece."""
    translation: str
    source_pieces: list
    target_pieces: list
    weights: np.ndarray


class LengthBuckets:
    """Batches of pairs of similar lengths, for `Model.fit` (an iterable it starts anew each pass).

    Each pass shuffles the pairs (from `attnx.random`'s stream, so `attnx.set_random_seed` repeats it),
    sorts each window of `window` batches' worth of pairs by target then source length, cuts the
    windows into batches of `batch_size` and shuffles the batches: a batch's rows then need little
    padding, and the order still changes every pass (fairseq's and OpenNMT's bucketing).

    Args:
        source, target: id arrays (N, S), (N, T) padded with 0 at the end.
        batch_size: rows per batch.
        window: batches per sorted window.
    """

    def __init__(self, source, target, batch_size=32, window=50):
        self.source, self.target = np.asarray(source), np.asarray(target)
        if len(self.source) != len(self.target):
            raise ValueError(f"LengthBuckets: {len(self.source)} sources but {len(self.target)} targets")
        self.batch_size = _positive_int("LengthBuckets", "batch_size", batch_size)
        self.window = _positive_int("LengthBuckets", "window", window)
        self.lengths = (self.target != 0).sum(axis=1) * (self.source.shape[1] + 1) + (self.source != 0).sum(axis=1)
        self.seed_generator = random.SeedGenerator(None, "LengthBuckets")

    def __len__(self):
        return -(-len(self.source) // self.batch_size)

    def __iter__(self):
        order = self.seed_generator.permutation(len(self.source))
        span = self.batch_size * self.window
        batches = []
        for lo in range(0, len(order), span):
            chunk = order[lo:lo + span]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        for i in self.seed_generator.permutation(len(batches)):
            yield self.source[batches[i]], self.target[batches[i]]


class Transformer(Model):
    """An encoder-decoder transformer for translation: a `Model` written as a class, trained with
    compile / fit / evaluate and saved with ``save`` like `attnx.seq2seq.Seq2Seq`, whose API it shares.

    Args:
        source_vocab_size, target_vocab_size: vocabulary sizes (id 0 is padding).
        model_dim: D, the embedding and model size (divisible by num_heads).
        num_heads, intermediate_dim, dropout, activation, layer_norm_epsilon, norm_first: those of
            every encoder and decoder layer (`attnx.layers.TransformerEncoderLayer`); dropout also
            applies to the embeddings plus positions.
        num_encoder_layers, num_decoder_layers: the depths of the two stacks.
        positions: "sinusoidal" (the paper's fixed encoding) or "learned" (`PositionEmbedding`,
            one table per side of `max_positions` rows).
        max_positions: the longest source or target a learned table covers.
        shared_embeddings: one embedding table for both sides (needs equal vocabulary sizes, e.g. a
            shared subword vocabulary).
        tie_output: the output projection is the target embedding table transposed (no bias).
        start_token, end_token: target start and end ids, or tokens of `target_tokenizer`.
        max_length: the longest target (tokens after the start token, end token included) that
            training accepts and decoding produces.
        source_tokenizer, target_tokenizer: `attnx.text.SubwordTokenizer`s (or one shared) for the
            methods that take sentences.
        dtype: the policy of every sublayer (`attnx.mixed_precision`), default the global policy;
            "mixed_bfloat16" runs every product (attention projections, feed-forward, output
            projection, tied or not) on bf16 operands, and the saved config records it.

    Bounds (a saved file sets these, and time and memory grow with them): vocabulary sizes <= 2**22,
    model_dim <= 16384, intermediate_dim <= 65536, up to 256 layers per stack, max_positions <= 8192,
    max_length (the longest decoding) <= 1024. Sources are at most `MAX_SOURCE_LENGTH` = 1024 subwords
    (CTranslate2's max_input_length): longer ids are a ValueError, longer sentences are cut to their
    first 1024 subwords by `encode_sources` (so by `translate`, `translate_batch`, `evaluate_bleu`).

    Data: ``fit(source, target)`` takes source ids (B, S) and target ids (B, T) that begin with the
    start token, 0 = padding. ``predict(source)`` returns greedy translations (see `predict_step`).
    Call: ``model([source, target_in])`` gives the teacher-forced logits (B, T, V).
    """

    MAX_SOURCE_LENGTH = decoding.MAX_SOURCE_LENGTH
    # translate_batch encodes at least this many sentences per encoder call, whatever the decoding
    # batch: at batch 1 the encoder read all its weights (and ran its Python layers) once per sentence
    ENCODE_BATCH = 32
    _warmup_from_fit = False  # compile(warmup_steps="auto") until the first fit sets the warm-up

    def __init__(self, source_vocab_size, target_vocab_size, model_dim=256, num_heads=4, intermediate_dim=1024,
                 num_encoder_layers=3, num_decoder_layers=3, dropout=0.1, activation="relu", norm_first=False,
                 layer_norm_epsilon=1e-5, positions="sinusoidal", max_positions=256, shared_embeddings=False,
                 tie_output=False, start_token="<start>", end_token="<end>", max_length=50, source_tokenizer=None,
                 target_tokenizer=None, dtype=None, name=None):
        super().__init__(name=name or unique_name("transformer"), dtype=dtype)
        owner = "Transformer"
        self.source_vocab_size = _positive_int(owner, "source_vocab_size", source_vocab_size, 2 ** 22)
        self.target_vocab_size = _positive_int(owner, "target_vocab_size", target_vocab_size, 2 ** 22)
        self.model_dim = _positive_int(owner, "model_dim", model_dim, 16384)
        _positive_int(owner, "intermediate_dim", intermediate_dim, 65536)
        _positive_int(owner, "num_encoder_layers", num_encoder_layers, 256)
        _positive_int(owner, "num_decoder_layers", num_decoder_layers, 256)
        self.num_heads, _ = head_sizes(owner, num_heads, self.model_dim)
        if positions not in ("sinusoidal", "learned"):
            raise ValueError(f"Transformer: `positions` must be 'sinusoidal' or 'learned', got {positions!r}")
        self.positions = positions
        self.max_positions = _positive_int(owner, "max_positions", max_positions, 8192)
        self.max_length = _positive_int(owner, "max_length", max_length, decoding.MAX_DECODING_LENGTH)
        if positions == "learned" and self.max_length > self.max_positions:
            raise ValueError(f"Transformer: max_length={max_length} is longer than the learned position tables "
                             f"(max_positions={max_positions})")
        self.shared_embeddings, self.tie_output = bool(shared_embeddings), bool(tie_output)
        if self.shared_embeddings and self.source_vocab_size != self.target_vocab_size:
            raise ValueError(f"Transformer: shared_embeddings needs one vocabulary size, got {source_vocab_size} "
                             f"and {target_vocab_size}")
        for side, tokenizer, size in (("source", source_tokenizer, self.source_vocab_size),
                                      ("target", target_tokenizer, self.target_vocab_size)):
            ids = None if tokenizer is None else getattr(tokenizer, "vocab_size", "no")
            if ids is not None and (not isinstance(ids, int) or ids > size):
                raise ValueError(f"Transformer: the {side} tokenizer has {ids} ids, expected a tokenizer of at most "
                                 f"{side}_vocab_size={size}")
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.start_id = self._token_id(start_token, "start_token")
        self.end_id = self._token_id(end_token, "end_token")
        self.stack_config = {"num_heads": self.num_heads, "intermediate_dim": intermediate_dim, "dropout": dropout,
                             "activation": activation, "layer_norm_epsilon": layer_norm_epsilon,
                             "norm_first": norm_first}
        dtype = self.dtype_policy  # every sublayer takes the model's policy (mixed_bfloat16: bf16 products)
        D = self.model_dim
        # Vaswani et al. scale the embeddings by sqrt(D): drawn with std D^-1/2, they enter at std 1
        init = initializers.RandomNormal(stddev=D ** -0.5)
        # fixed layer names: the weights are "source_embedding/...", "encoder/...", ... in every Transformer
        self.source_embedding = Embedding(self.source_vocab_size, D, embeddings_initializer=init, dtype=dtype,
                                          name="source_embedding")
        self.target_embedding = self.source_embedding if self.shared_embeddings else Embedding(
            self.target_vocab_size, D, embeddings_initializer=init, dtype=dtype, name="target_embedding")
        if positions == "sinusoidal":
            self.source_positions = self.target_positions = PositionalEncoding(dtype=dtype, name="positions")
        else:
            self.source_positions = PositionEmbedding(self.max_positions, dtype=dtype, name="source_positions")
            self.target_positions = PositionEmbedding(self.max_positions, dtype=dtype, name="target_positions")
        self.embedding_dropout = Dropout(dropout, dtype=dtype, name="embedding_dropout")
        self.encoder = TransformerEncoder(num_encoder_layers, **self.stack_config, dtype=dtype, name="encoder")
        self.encoder_norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="encoder_norm")
        self.decoder = TransformerDecoder(num_decoder_layers, **self.stack_config, dtype=dtype, name="decoder")
        self.decoder_norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="decoder_norm")
        self.output_projection = None if self.tie_output else Dense(self.target_vocab_size, dtype=dtype,
                                                                    name="output")
        self.build()

    # ------------------------------------------------------------------------ construction
    @classmethod
    def from_texts(cls, sources, targets, vocab_size=8000, shared_vocabulary=True, **kwargs):
        """Learns SentencePiece BPE subword vocabularies (`subword_tokenizers`) of about `vocab_size`
        ids on the sentences as written, one shared by both sides (and then, unless told otherwise,
        one shared embedding table) or one per side, and builds a model for them. Sentences may carry
        the ``<start>`` / ``<end>`` markers of `attnx.datasets.preprocess_sentence`."""
        source_tok, target_tok = subword_tokenizers(sources, targets, vocab_size, shared_vocabulary)
        if shared_vocabulary:
            kwargs.setdefault("shared_embeddings", True)
        return cls(source_tok.vocab_size, target_tok.vocab_size, source_tokenizer=source_tok,
                   target_tokenizer=target_tok, **kwargs)

    def _token_id(self, token, arg):
        if isinstance(token, str):
            if self.target_tokenizer is None or token not in self.target_tokenizer.word_index:
                raise ValueError(f"Transformer: `{arg}` {token!r} is not an id and not a token of the target tokenizer")
            token = self.target_tokenizer.word_index[token]
        return decoding.token_id("Transformer", arg, token, self.target_vocab_size)

    def quantize_refusal(self):
        if self.tie_output:
            return "tie_output=True multiplies by the target embedding table itself, which int8 would replace"
        return None

    def build(self, input_shape=None):
        """Creates the weights (`input_shape` is not needed: no weight depends on the sequence lengths)."""
        D = self.model_dim
        sequence = (None, None, D)
        shapes = [(self.source_embedding, (None, None)), (self.target_embedding, (None, None)),
                  (self.source_positions, sequence), (self.target_positions, sequence),
                  (self.encoder, sequence), (self.encoder_norm, sequence), (self.decoder, [sequence, sequence]),
                  (self.decoder_norm, sequence)]
        if self.output_projection is not None:
            shapes.append((self.output_projection, sequence))
        for layer, shape in shapes:
            if not layer.built:
                layer.build(shape)
                layer.built = True
        self.built = True

    def get_config(self):
        """The constructor's arguments, tokenizers included (as their JSON)."""
        tokenizers = {"source_tokenizer": self.source_tokenizer, "target_tokenizer": self.target_tokenizer}
        return {"name": self.name, "source_vocab_size": self.source_vocab_size,
                "target_vocab_size": self.target_vocab_size, "model_dim": self.model_dim,
                "num_encoder_layers": self.encoder.num_layers, "num_decoder_layers": self.decoder.num_layers,
                **self.stack_config, "positions": self.positions, "max_positions": self.max_positions,
                "shared_embeddings": self.shared_embeddings, "tie_output": self.tie_output,
                "start_token": self.start_id, "end_token": self.end_id, "max_length": self.max_length,
                "dtype": self.dtype_policy.name,
                **{k: None if t is None else t.to_json() for k, t in tokenizers.items()}}

    @classmethod
    def from_config(cls, config):
        return cls(**tokenizers_from_config(config))

    # ------------------------------------------------------------------------ training
    PAPER_WARMUP_STEPS = 4000

    def compile(self, optimizer=None, loss=None, metrics=None, loss_weights=None, distribute=None,
                label_smoothing=0.1, warmup_steps="auto"):
        """As `Model.compile`, with the paper's recipe as defaults: Adam (beta_2 0.98, epsilon 1e-9) on
        `optimizers.NoamDecay` (a linear warm-up, then a decay as 1/sqrt(step)), and the cross-entropy
        of each next target token from the logits with `label_smoothing`, padding (id 0) ignored,
        averaged over the real tokens.

        `warmup_steps`: "auto" (default) scales the warm-up to the run, so that a short run learns: the
        first `fit` sets it to a tenth of the steps it will take (epochs times batches per epoch), at
        most the paper's 4000, and the rate rises to the paper's peak, (model_dim * 4000) ** -0.5,
        whatever the warm-up's length (data without a length: 4000 steps). A warm-up of a tenth keeps
        the rate near its peak for most of a short run; the paper's 4000 steps would take a first run
        of a few minutes all its time to reach it. A number is the paper's schedule
        with that warm-up (peak (model_dim * warmup_steps) ** -0.5), as is any schedule or optimizer
        given. A fit that starts from a trained optimizer keeps its schedule."""
        self._warmup_from_fit = optimizer is None and isinstance(warmup_steps, str) and warmup_steps == "auto"
        if optimizer is None:
            if self._warmup_from_fit:
                schedule = self._run_scaled_schedule(self.PAPER_WARMUP_STEPS)
            else:
                schedule = optimizers.NoamDecay(self.model_dim, _positive_int("Transformer.compile", "warmup_steps",
                                                                              warmup_steps))
            optimizer = optimizers.Adam(schedule, beta_2=0.98, epsilon=1e-9)
        if loss is None:
            loss = losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0,
                                                        label_smoothing=label_smoothing)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, loss_weights=loss_weights,
                        distribute=distribute)

    def _run_scaled_schedule(self, warmup_steps):
        """NoamDecay with `warmup_steps`, scaled to peak at the paper's rate (model_dim * 4000) ** -0.5."""
        return optimizers.NoamDecay(self.model_dim, warmup_steps, math.sqrt(warmup_steps / self.PAPER_WARMUP_STEPS))

    def fit(self, x=None, y=None, batch_size=None, epochs=1, **kwargs):
        """`Model.fit`; the first fit after ``compile(warmup_steps="auto")`` sets the warm-up to the run
        (see `compile`)."""
        if self._warmup_from_fit and self.optimizer.iterations == 0:
            steps = kwargs.get("steps_per_epoch")
            if steps is None and isinstance(x, np.ndarray):
                kept = int(len(x) * (1.0 - kwargs.get("validation_split", 0.0)))  # the training part, as fit cuts it
                steps = -(-kept // (batch_size or 32))
            elif steps is None and hasattr(x, "__len__") and not isinstance(x, (list, tuple, dict)):
                steps = len(x)  # an iterable of batches (LengthBuckets, a Dataset)
            total = None if steps is None else steps * max(1, epochs - kwargs.get("initial_epoch", 0))
            if total is not None:
                warmup = max(1, min(self.PAPER_WARMUP_STEPS, total // 10))
                self.optimizer.learning_rate = self._run_scaled_schedule(warmup)
                self._compile_config["optimizer"] = optimizers.serialize(self.optimizer)
            self._warmup_from_fit = False
        return super().fit(x, y, batch_size=batch_size, epochs=epochs, **kwargs)

    def _embed(self, embedding, positions, ids, training):
        """``dropout(E[ids] * sqrt(D) + P)`` and its cache."""
        x, embedding_cache = embedding.apply(ids, training=training)
        x, positions_cache = positions.apply(x * x.dtype.type(math.sqrt(self.model_dim)), training=training)
        x, dropout_cache = self.embedding_dropout.apply(x, training=training)
        return x, (embedding_cache, positions_cache, dropout_cache)

    def _embed_backprop(self, embedding, positions, cache, dx):
        embedding_cache, positions_cache, dropout_cache = cache
        dx = positions.backprop(positions_cache, self.embedding_dropout.backprop(dropout_cache, dx))
        embedding.backprop(embedding_cache, dx * dx.dtype.type(math.sqrt(self.model_dim)))

    def _logits(self, h, training):
        """logits (..., V) of the decoder output h (..., D), and the cache of the projection."""
        if self.output_projection is not None:
            return self.output_projection.apply(h, training=training)
        table = self.target_embedding.params["embeddings"]
        if self.dtype_policy.name == "mixed_bfloat16":  # in bf16, as the untied projection's Dense
            logits = kernels.bf16_matmul(a=h.reshape(-1, self.model_dim), b=table, transpose_b=True)
            return logits.reshape(h.shape[:-1] + (-1,)), (h if training else None)
        return h @ table.T, (h if training else None)

    def _logits_backprop(self, cache, dlogits):
        if self.output_projection is not None:
            return self.output_projection.backprop(cache, dlogits)
        # logits = h E^T:  dE += dlogits^T h,  dh = dlogits E
        table, V = self.target_embedding.params["embeddings"], self.target_vocab_size
        if self.dtype_policy.name == "mixed_bfloat16":
            flat = dlogits.reshape(-1, V)
            kernels.bf16_matmul(a=flat, b=cache.reshape(-1, self.model_dim), transpose_a=True,
                                out=self.target_embedding.grads["embeddings"])
            return kernels.bf16_matmul(a=flat, b=table).reshape(dlogits.shape[:-1] + (self.model_dim,))
        self.target_embedding.grads["embeddings"] += dlogits.reshape(-1, V).T @ cache.reshape(-1, self.model_dim)
        return dlogits @ table

    def _encode(self, source, training=False):
        """(memory (B, S, D), source mask (B, S), caches) of checked source ids."""
        source_mask = source != 0
        x, embedding_cache = self._embed(self.source_embedding, self.source_positions, source, training)
        # the mask of checked ids needs no other check: the stacks take it as checked
        x, encoder_cache = self.encoder.forward_checked(x, source_mask, training=training)
        memory, norm_cache = self.encoder_norm.apply(x, training=training)
        return memory, source_mask, (embedding_cache, encoder_cache, norm_cache)

    def forward(self, inputs, training=False):
        """``[source (B, S), decoder_input (B, T)]`` -> (logits (B, T, V), cache)."""
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Model '{self.name}': inputs must be [source ids, decoder input ids]")
        source = self._source(inputs[0])
        target = self._ids(inputs[1], "decoder_input", self.target_vocab_size)
        if len(target) != len(source):
            raise ValueError(f"Transformer: {len(source)} sources but {len(target)} decoder inputs")
        memory, source_mask, source_caches = self._encode(source, training)
        y, target_embedding_cache = self._embed(self.target_embedding, self.target_positions, target, training)
        # the causal mask alone: targets are padded at the end, so a real position never sees padding
        # (the outputs at padded positions are not scored)
        h, decoder_cache = self.decoder.forward_checked(y, memory, None, source_mask, use_causal_mask=True,
                                                        training=training)
        h, decoder_norm_cache = self.decoder_norm.apply(h, training=training)
        logits, output_cache = self._logits(h, training)
        if not training:
            return logits, None
        return logits, _Cache(source_caches[0], source_caches[1], source_caches[2], target_embedding_cache,
                              decoder_cache, decoder_norm_cache, output_cache)

    def backprop(self, cache, dy, need_dx=True):
        dh = self.decoder_norm.backprop(cache.decoder_norm, self._logits_backprop(cache.output, dy))
        dy_target, dmemory = self.decoder.backprop(cache.decoder, dh)
        self._embed_backprop(self.target_embedding, self.target_positions, cache.target_embedding, dy_target)
        dx = self.encoder.backprop(cache.encoder, self.encoder_norm.backprop(cache.encoder_norm, dmemory))
        self._embed_backprop(self.source_embedding, self.source_positions, cache.source_embedding, dx)
        return [None, None]  # token ids have no gradient

    def train_data(self, x, y):
        """Teacher forcing, as `Seq2Seq.train_data`: source ids `x` (B, S) and target ids `y` (B, T)
        starting with the start token give the inputs ``[x, y[:, :-1]]`` and the targets ``y[:, 1:]``;
        the trailing columns that are padding in every row are cut first."""
        source, target = self._source(x), self._target(y)
        if len(source) != len(target):
            raise ValueError(f"Transformer: {len(source)} sources but {len(target)} targets")
        source = source[:, :np.flatnonzero((source != 0).any(axis=0))[-1] + 1]
        target = target[:, :np.flatnonzero((target != 0).any(axis=0))[-1] + 1]
        return [source, target[:, :-1]], target[:, 1:]

    def predict_step(self, x):
        """Greedy translations of source ids `x` (B, S): target ids (B, max_length), each row ending
        with the end token (unless cut at max_length) and padded with 0 after it."""
        tokens, _, _ = self.greedy_decode(x)
        return np.pad(tokens, ((0, 0), (0, self.max_length - tokens.shape[1])))

    def _ids(self, ids, arg, vocab_size):
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"Transformer: `{arg}` must be integer ids, got dtype {ids.dtype}")
        if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"Transformer: `{arg}` expected non-empty ids of shape (batch, steps), got {ids.shape}")
        if ids.min() < 0 or ids.max() >= vocab_size:
            bad = ids.min() if ids.min() < 0 else ids.max()
            raise IndexError(f"Transformer: `{arg}` has the token id {bad}, out of range [0, {vocab_size})")
        if self.positions == "learned" and ids.shape[1] > self.max_positions:
            raise ValueError(f"Transformer: `{arg}` has {ids.shape[1]} positions, more than the learned tables' "
                             f"max_positions={self.max_positions}")
        return ids.astype(np.int64, copy=False)

    def _source(self, source, arg="source"):
        ids = self._ids(source, arg, self.source_vocab_size)
        if ids.shape[1] > self.MAX_SOURCE_LENGTH:
            raise ValueError(f"Transformer: `{arg}` has {ids.shape[1]} steps, more than MAX_SOURCE_LENGTH = "
                             f"{self.MAX_SOURCE_LENGTH}; cut the sources (encode_sources does for sentences)")
        empty = ~(ids != 0).any(axis=1)
        if empty.any():
            raise ValueError(f"Transformer: `{arg}` has an empty sentence (a row of padding only) at row "
                             f"{int(np.argmax(empty))}")
        return ids

    def _target(self, target):
        """Teacher-forcing targets: each row the start token, 1 to max_length tokens, then padding."""
        return check_target_ids(self._ids(target, "target", self.target_vocab_size), "Transformer", "target",
                                 self.start_id, self.max_length)

    # ------------------------------------------------------------------------ texts
    def _require_tokenizers(self, what):
        if self.source_tokenizer is None or self.target_tokenizer is None:
            raise RuntimeError(f"Transformer: {what} needs source_tokenizer and target_tokenizer")

    def encode_sources(self, sentences):
        """Sentences (``<start>`` / ``<end>`` markers optional) -> padded source ids (B, S), each cut to
        its first `MAX_SOURCE_LENGTH` subwords."""
        self._require_tokenizers("encode_sources")
        seqs = subword_sources("Transformer", self.source_tokenizer, sentences, self.MAX_SOURCE_LENGTH)
        return text.pad_sequences(seqs, padding="post").astype(np.int64)

    def encode_targets(self, sentences):
        """Sentences -> target ids (B, T): the start token, the subwords, the end token, padding."""
        self._require_tokenizers("encode_targets")
        seqs = subword_targets(self.target_tokenizer, sentences, self.start_id, self.end_id)
        return text.pad_sequences(seqs, padding="post").astype(np.int64)

    def fit_texts(self, sources, targets, validation_data=None, batch_size=32, length_buckets=True, **kwargs):
        """`fit` on sentence lists; `validation_data` is a pair of sentence lists too, the other
        arguments are `Model.fit`'s. With `length_buckets`, each batch holds pairs of similar
        lengths (`LengthBuckets`), so that little of a batch is padding. Returns the `History`."""
        val = None if validation_data is None else (self.encode_sources(validation_data[0]),
                                                    self.encode_targets(validation_data[1]))
        source, target = self.encode_sources(sources), self.encode_targets(targets)
        if length_buckets:
            return self.fit(LengthBuckets(source, target, batch_size), validation_data=val, **kwargs)
        return self.fit(source, target, batch_size=batch_size, validation_data=val, **kwargs)

    def target_text(self, tokens):
        """Target ids (without start / end tokens) -> the detokenized sentence."""
        return self.target_tokenizer.decode(tokens)

    def attention_maps(self, sentence, width=1, length_penalty=0.0, max_length=None):
        """Translates a sentence (`translate_batch`) and returns its `AttentionMaps`: the cross-attention
        of every decoder layer and head over the source pieces, from the decoder run once more on the
        translation (teacher forcing: the rows `translate` returns, there the last layer's mean of heads)."""
        if not isinstance(sentence, str):
            raise TypeError(f"Transformer.attention_maps: expected a str sentence, got {type(sentence).__name__}")
        best = self.translate_batch([sentence], width, length_penalty, max_length)[0]
        source = self.encode_sources([sentence])
        target_in = np.array([[self.start_id] + list(best.tokens)], dtype=np.int64)
        memory, source_mask, _ = self._encode(source)
        y, _ = self._embed(self.target_embedding, self.target_positions, target_in, False)
        (_, _, cross), _ = self.decoder.forward_checked(y, memory, None, source_mask, use_causal_mask=True,
                                                        return_attention_scores=True)
        rows = best.attention.shape[-2]  # no end row for a translation cut at max_length
        index_word = self.target_tokenizer.index_word
        return AttentionMaps(self.target_text(best.tokens), self.source_tokenizer.tokenize(_strip_markers(sentence)),
                             ([index_word[t] for t in best.tokens] + ["<end>"])[:rows],
                             np.stack([w[0, :, :rows] for w in cross]))

    # ------------------------------------------------------------------------ decoding
    def _decode_length(self, max_length):
        """The decoding's length: the model's, or `max_length` within `decoding.MAX_DECODING_LENGTH`
        (1024) and the learned position tables' rows."""
        bound = decoding.MAX_DECODING_LENGTH
        bound = min(bound, self.max_positions) if self.positions == "learned" else bound
        return self.max_length if max_length is None else _positive_int("Transformer", "max_length", max_length, bound)

    def start_state(self, memory, source_mask, capacity=None):
        """The decoding state of encoder outputs memory (N, S, D) with source mask (N, S): the
        decoder stack's `DecoderCache` (cross-attention keys and values projected once, room for
        `capacity` positions, default max_length)."""
        return self.decoder.start_cache(memory, source_mask, self.max_length if capacity is None else capacity)

    def step(self, ids, position, state, return_attention=False):
        """One decoder position for N rows: the decoder stack's cached step (one C++ call for every
        layer), then the final norm and the output projection. The searches run `compiled_step`'s
        C++ step instead when they can; this is the step protocol's for other callers.

        Args:
            ids: (N,) the previous tokens (the start token at position 0).
            position: the target position of `ids` (the number of steps decoded before).
            state: the `DecoderCache` of ``start_state``, or of the last step (extended in place and
                returned; its ``select(rows)`` gives the state of some rows).
            return_attention: also return the last layer's cross-attention (N, heads, S).
        Returns:
            (logits (N, V), the next state, attention or None); equal to the teacher-forced
            forward's logits at `position`.
        """
        if not isinstance(state, DecoderCache):
            raise TypeError(f"Transformer.step: `state` must be the DecoderCache of start_state or of the last "
                            f"step, got {type(state).__name__}")
        if position != state.length:
            raise ValueError(f"Transformer.step: the state holds {state.length} decoded positions, so the next "
                             f"position is {state.length}, got position={position}")
        x, _ = self.target_embedding.apply(np.asarray(ids, dtype=np.int64)[:, None])
        x = x[:, 0] * x.dtype.type(math.sqrt(self.model_dim))
        x += self._position_rows(position + 1)[position]
        h, state, weights = self.decoder.step(x, state, return_attention_scores=return_attention)
        h, _ = self.decoder_norm.apply(h)
        logits, _ = self._logits(h, False)
        return logits, state, weights

    def _position_rows(self, length):
        """The target position rows 0..length-1 added to the embedded tokens (length, D)."""
        if self.positions == "sinusoidal":
            return self.target_positions.table(length, self.model_dim)
        return self.target_positions.params["embeddings"][:length]

    def compiled_step(self, state, max_length):
        """What `attnx.decoding`'s search needs to run this model's `step` in C++ from the start
        state `state` for up to `max_length` positions: `kernels.search_decoder_stack` and its
        arguments (the memory's cross keys and values, the decoder stack's weights, the embedding,
        positions, final norm and output projection; a quantized model's int8 embedding rows and
        scales, and its kernels packed: `quantization.step_product`), or None when a part of the step
        is not the step's kernels' (bfloat16 products, an output activation): the search then calls
        `step` back."""
        projection = self.output_projection
        if state.length or (projection is not None and (projection.compute_dtype == "bfloat16"
                                                        or projection.activation != "linear")):
            return None
        first, embedding = self.decoder.blocks[0], self.target_embedding
        output_kernel, output_bias = (None, None) if projection is None else quantization.step_product(projection)
        return kernels.search_decoder_stack, {
            "cross_keys": state.cross_keys, "cross_values": state.cross_values, "source_mask": state.source_mask,
            "weights": state.layer_weights, "num_heads": first.num_heads, "norm_first": first.norm_first,
            "epsilon": first.layer_norm_epsilon, "activation": first.activation,
            "embedding": embedding.params["embeddings"], "embedding_row_scale": embedding.params.get("embeddings_scale"),
            "embedding_scale": math.sqrt(self.model_dim),
            "positions": np.ascontiguousarray(self._position_rows(max_length)),
            "norm_gamma": self.decoder_norm.params.get("gamma"), "norm_beta": self.decoder_norm.params.get("beta"),
            "norm_epsilon": self.decoder_norm.epsilon, "output_kernel": output_kernel, "output_bias": output_bias}

    def _start(self, source):
        """The start state of checked source ids: the memory's cross keys and values, room for one
        position (the C++ search keeps its own caches; a Python step grows it)."""
        memory, source_mask, _ = self._encode(source)
        return self.start_state(memory, source_mask, capacity=1)

    def greedy_decode(self, source, max_length=None, return_attention=True):
        """The most likely next token at every step, for source ids (B, S) (`attnx.decoding.greedy_search`,
        the whole batch in one C++ call); a row leaves the batch at its end token.

        Returns (tokens (B, L) with the end token and 0 after it, scores (B,) the summed log
        probabilities, attention (B, heads, L, S) of the last decoder layer, or None without
        `return_attention`), L <= max_length (default the model's; at most 1024, and the learned
        position table's rows)."""
        source = self._source(source)
        L = self._decode_length(max_length)
        return decoding.greedy_search(self, self._start(source), len(source), self.start_id, self.end_id, L,
                                      return_attention)

    def beam_search(self, source, width=4, length_penalty=0.0, max_length=None, return_attention=True):
        """Batched beam search (`attnx.decoding.beam_search`, the whole batch in one C++ call: a
        finished hypothesis stays in its beam, extended by padding at no cost; final scores divided
        by GNMT's length penalty ((5 + len) / 6) ** alpha); a sentence leaves the batch once all its
        beams have ended. Width 1 is greedy decoding.

        Args:
            source: source ids (B, S).
            width: beams per sentence (1 to the target vocabulary size; 1 gives greedy decoding).
            length_penalty: alpha >= 0.
            max_length: most tokens per hypothesis (default the model's max_length; at most 1024).
            return_attention: keep each hypothesis' attention (else it is None).
        Returns:
            For each sentence, its `width` `Hypothesis`es, best first; their attention is the last
            decoder layer's per head, (heads, steps, S).
        """
        width = decoding.beam_width("Transformer.beam_search", width, self.target_vocab_size)
        alpha = decoding.length_penalty_alpha("Transformer.beam_search", length_penalty)
        source = self._source(source)
        L = self._decode_length(max_length)
        return decoding.beam_search(self, self._start(source), len(source), self.start_id, self.end_id, width, alpha,
                                    L, return_attention)

    def translate_batch(self, sentences, width=1, length_penalty=0.0, max_length=None, batch_size=32,
                        return_attention=True):
        """Translates sentences (``<start>`` / ``<end>`` markers optional), `batch_size` at a time
        in order of length (CTranslate2's `translate_batch`: rows of one batch then have similar
        lengths), greedily (width 1) or by beam search, each batch in one C++ call. Sentences are
        encoded `ENCODE_BATCH` (or `batch_size`) at a time whatever the batch.

        Returns one `Hypothesis` per sentence, in the input order, the best of its beam; its
        ``tokens`` are target ids (`target_text` detokenizes them), its attention None without
        `return_attention`."""
        owner = "Transformer.translate_batch"
        self._require_tokenizers("translate_batch")
        batch_size = _positive_int(owner, "batch_size", batch_size)
        width = decoding.beam_width(owner, width, self.target_vocab_size)
        alpha = decoding.length_penalty_alpha(owner, length_penalty)
        L = self._decode_length(max_length)
        sentences = list(sentences)
        if not sentences:
            return []
        source = self._source(self.encode_sources(sentences))  # checked once for every batch
        lengths = (source != 0).sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        group = max(batch_size, self.ENCODE_BATCH)
        results = [None] * len(sentences)
        for lo in range(0, len(order), group):
            rows = order[lo:lo + group]
            state = self._start(source[rows][:, :lengths[rows].max()])

            def batch_state(first, count, rows=rows, state=state):  # the batch's rows, its real positions
                return state.select(np.arange(first, first + count),
                                    sources=int(lengths[rows[first:first + count]].max()))

            found = decoding.beam_search(self, state, len(rows), self.start_id, self.end_id, width, alpha, L,
                                         return_attention, batch_size=batch_size, select=batch_state)
            for first in range(0, len(rows), batch_size):
                keys = int(lengths[rows[first:first + batch_size]].max())  # the batch's attention: its positions
                for row, hyps in zip(rows[first:first + batch_size], found[first:first + batch_size]):
                    best = hyps[0]
                    results[row] = best if best.attention is None else \
                        best._replace(attention=best.attention[..., :keys])
        return results

    def translate(self, sentence, width=1, length_penalty=0.0, max_length=None):
        """Translates one sentence, as `Seq2Seq.translate`.

        Returns (the detokenized translation, attention (target tokens + 1, source tokens)): the last
        decoder layer's cross-attention averaged over the heads (`translate_batch` gives each head's),
        with rows for the target subwords and the end token and columns for the source subwords
        (``model.source_tokenizer.tokenize(sentence)``)."""
        if not isinstance(sentence, str):
            raise TypeError(f"Transformer.translate: expected a str sentence, got {type(sentence).__name__}")
        best = self.translate_batch([sentence], width, length_penalty, max_length)[0]
        return self.target_text(best.tokens), best.attention.mean(axis=0)

    def evaluate_bleu(self, sources, references, width=1, length_penalty=0.0, batch_size=64, max_length=None,
                      scorer="auto", normalize=False):
        """Corpus BLEU-4 of the translations of `sources` against `references` (`translation_bleu`): by
        default sacreBLEU on the cased, detokenized text as written, with its signature; with
        ``normalize=True`` on the loader's lowercased, punctuation-split text of both sides, the same
        function on the same text as `Seq2Seq.evaluate_bleu`'s. Returns a `metrics.BleuScore`."""
        hyps = [self.target_text(h.tokens)
                for h in self.translate_batch(sources, width, length_penalty, max_length, batch_size,
                                              return_attention=False)]
        return translation_bleu(hyps, references, normalize, scorer)
