"""Text preprocessing: a Keras-compatible `Tokenizer` and `pad_sequences`.

Both follow the behaviour of `tf.keras.preprocessing.text.Tokenizer` and
`keras.utils.pad_sequences` (keras_preprocessing 1.1.x / Keras 3 legacy
preprocessing) output for output, so code and saved tokenizers written for
Keras work unchanged. The few places where attnx is stricter than Keras (it
raises on invalid arguments up front instead of failing later, or not at all)
are listed in the docstrings.
"""

from __future__ import annotations

import json
import numbers
from collections import Counter, OrderedDict, defaultdict
from typing import NamedTuple

import numpy as np

__all__ = [
    "DEFAULT_FILTERS",
    "SubwordTokenizer",
    "Tokenizer",
    "WordVectors",
    "load_word_vectors",
    "pad_sequences",
    "text_to_word_sequence",
    "tokenizer_from_json",
]

#: Characters removed by default: all ASCII punctuation except `'`, plus tab
#: and newline (Keras' default).
DEFAULT_FILTERS = '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n'

_MATRIX_MODES = ("binary", "count", "tfidf", "freq")
_PAD_POSITIONS = ("pre", "post")


def text_to_word_sequence(text, filters=DEFAULT_FILTERS, lower=True, split=" "):
    """Converts a text to a list of words.

    Every character of `filters` is replaced by `split`, the text is split on
    `split` and empty strings are dropped.

    Args:
        text: Input string.
        filters: Characters to remove (each is replaced by `split`).
        lower: Whether to lowercase the text first.
        split: Word separator.

    Returns:
        A list of words (strings).
    """
    if lower:
        text = text.lower()
    text = text.translate(str.maketrans({char: split for char in filters}))
    return [word for word in text.split(split) if word]


class Tokenizer:
    """Text tokenization utility, identical in behaviour to Keras' `Tokenizer`.

    Turns texts into sequences of word indices, or into bag-of-words matrices.
    Index 0 is reserved (padding) and never assigned to a word. Words are
    indexed by decreasing count; words with equal counts keep the order in
    which they were first seen. When `oov_token` is given it always gets
    index 1.

    Args:
        num_words: If set, only words with index `< num_words` are used when
            converting texts (so at most `num_words - 1` indices, the OOV
            index included). The vocabulary itself (`word_index`) is always
            complete. `0` or `None` means no limit.
        filters: Characters removed from the texts. Ignored when
            `char_level=True` or when a text is already a list of tokens.
        lower: Whether to lowercase the texts.
        split: Word separator.
        char_level: If True, every character is a token.
        oov_token: If given, it is added to `word_index` with index 1 and
            replaces out-of-vocabulary words (and words cut by `num_words`)
            in `texts_to_sequences`. Otherwise such words are dropped.

    Attributes:
        word_counts: OrderedDict word -> number of occurrences, in first-seen
            order.
        word_docs: dict word -> number of texts containing it.
        word_index: dict word -> index (1-based).
        index_word: dict index -> word.
        index_docs: dict index -> number of texts containing the word.
        document_count: number of texts seen by `fit_on_texts` /
            `fit_on_sequences`.
    """

    def __init__(
        self,
        num_words=None,
        filters=DEFAULT_FILTERS,
        lower=True,
        split=" ",
        char_level=False,
        oov_token=None,
    ):
        self.num_words = num_words
        self.filters = filters
        self.lower = lower
        self.split = split
        self.char_level = char_level
        self.oov_token = oov_token
        self.document_count = 0
        self.word_counts = OrderedDict()
        self.word_docs = defaultdict(int)
        self.index_docs = defaultdict(int)
        self.word_index = {}
        self.index_word = {}

    def _tokenize(self, text):
        """Splits one text (a string, or a list of tokens) into tokens."""
        if isinstance(text, list):
            return [token.lower() for token in text] if self.lower else text
        if self.char_level:
            return text.lower() if self.lower else text
        return text_to_word_sequence(text, self.filters, self.lower, self.split)

    def fit_on_texts(self, texts):
        """Updates the vocabulary from a list of texts.

        Can be called several times; counts accumulate and the indices are
        recomputed from all texts seen so far.

        Args:
            texts: Iterable of strings, or of lists of tokens (each list item
                is taken as one token).
        """
        for text in texts:
            self.document_count += 1
            tokens = self._tokenize(text)
            for token in tokens:
                self.word_counts[token] = self.word_counts.get(token, 0) + 1
            for token in dict.fromkeys(tokens):  # each once, in first-seen order: the same in every process
                self.word_docs[token] += 1

        # `sorted` is stable: words with equal counts stay in first-seen order.
        by_count = sorted(self.word_counts.items(), key=lambda item: item[1], reverse=True)
        vocabulary = [] if self.oov_token is None else [self.oov_token]
        vocabulary.extend(word for word, _ in by_count)
        # Built like Keras (a dict over the list): if the OOV token also occurs
        # in the texts, its later position wins, exactly as in Keras.
        self.word_index = dict(zip(vocabulary, range(1, len(vocabulary) + 1)))
        self.index_word = {index: word for word, index in self.word_index.items()}
        for word, doc_count in self.word_docs.items():
            self.index_docs[self.word_index[word]] = doc_count

    def fit_on_sequences(self, sequences):
        """Updates the document statistics from sequences of indices.

        Needed before `sequences_to_matrix(mode='tfidf')` when
        `fit_on_texts` was never called.

        Args:
            sequences: List of sequences of integer word indices.
        """
        self.document_count += len(sequences)
        for sequence in sequences:
            for index in dict.fromkeys(sequence):
                self.index_docs[index] += 1

    def _kept(self, index):
        """Whether `index` survives the `num_words` limit."""
        return not self.num_words or index < self.num_words

    def texts_to_sequences(self, texts):
        """Transforms each text into a list of word indices.

        Words outside the vocabulary or cut by `num_words` become the OOV index
        when `oov_token` is set and are dropped otherwise.

        Args:
            texts: Iterable of strings, or of lists of tokens.

        Returns:
            A list of lists of ints.
        """
        oov_index = self.word_index.get(self.oov_token)
        sequences = []
        for text in texts:
            sequence = []
            for token in self._tokenize(text):
                index = self.word_index.get(token)
                if index is not None and self._kept(index):
                    sequence.append(index)
                elif oov_index is not None:
                    sequence.append(oov_index)
            sequences.append(sequence)
        return sequences

    def sequences_to_texts(self, sequences):
        """Transforms sequences of word indices back into space-joined texts.

        Unknown indices and indices cut by `num_words` become the OOV token
        when `oov_token` is set and are dropped otherwise (index 0 included).

        Args:
            sequences: Iterable of sequences of integer word indices.

        Returns:
            A list of strings.
        """
        oov_index = self.word_index.get(self.oov_token)
        texts = []
        for sequence in sequences:
            words = []
            for index in sequence:
                word = self.index_word.get(index)
                if word is not None and self._kept(index):
                    words.append(word)
                elif oov_index is not None:
                    words.append(self.index_word[oov_index])
            texts.append(" ".join(words))
        return texts

    def texts_to_matrix(self, texts, mode="binary"):
        """Converts texts to a bag-of-words matrix.

        Args:
            texts: Iterable of strings, or of lists of tokens.
            mode: One of `"binary"`, `"count"`, `"tfidf"`, `"freq"`.

        Returns:
            A float64 array of shape `(len(texts), num_words)`, or
            `(len(texts), len(word_index) + 1)` without `num_words`.

        Raises:
            ValueError: For an unknown `mode`, or when the tokenizer has no
                vocabulary and no `num_words`.
        """
        return self.sequences_to_matrix(self.texts_to_sequences(texts), mode=mode)

    def sequences_to_matrix(self, sequences, mode="binary"):
        """Converts sequences of word indices to a bag-of-words matrix.

        Column `j` holds, for word index `j`: 1 (`"binary"`), its count
        (`"count"`), its count divided by the sequence length (`"freq"`), or
        `(1 + log(count)) * log(1 + document_count / (1 + docs(j)))`
        (`"tfidf"`, where `docs(j)` is the number of fitted documents that
        contain `j`). Indices `>= num_words` are ignored; column 0 is always 0
        unless index 0 occurs.

        Args:
            sequences: List of sequences of integer word indices.
            mode: One of `"binary"`, `"count"`, `"tfidf"`, `"freq"`.

        Returns:
            A float64 array of shape `(len(sequences), width)`, `width` being
            `num_words` if set and `len(word_index) + 1` otherwise.

        Raises:
            ValueError: For an unknown `mode` (Keras only raises once a
                sequence is non-empty), when the width cannot be determined,
                or for `"tfidf"` before any fitting.
        """
        if mode not in _MATRIX_MODES:
            raise ValueError(f"Unknown vectorization mode {mode!r}; expected one of {_MATRIX_MODES}.")
        if self.num_words:
            width = self.num_words
        elif self.word_index:
            width = len(self.word_index) + 1
        else:
            raise ValueError("Specify a dimension (`num_words` argument), or fit on some text data first.")
        if mode == "tfidf" and not self.document_count:
            raise ValueError("Fit the Tokenizer on some data before using tfidf mode.")

        matrix = np.zeros((len(sequences), width))
        for row, sequence in enumerate(sequences):
            counts = defaultdict(int)
            for index in sequence:
                if index < width:
                    counts[index] += 1
            for index, count in counts.items():
                if mode == "count":
                    matrix[row, index] = count
                elif mode == "freq":
                    # Keras divides by the full length, ignored indices included.
                    matrix[row, index] = count / len(sequence)
                elif mode == "binary":
                    matrix[row, index] = 1
                else:  # tfidf, weighting scheme 2 of the Wikipedia tf-idf article
                    tf = 1 + np.log(count)
                    idf = np.log(1 + self.document_count / (1 + self.index_docs.get(index, 0)))
                    matrix[row, index] = tf * idf
        return matrix

    def get_config(self):
        """Returns the tokenizer's configuration and state, as Keras does.

        The vocabulary dictionaries are stored as JSON strings (Keras' format),
        so `to_json` output is readable by Keras' `tokenizer_from_json` and
        vice versa.

        Returns:
            A dict of JSON-serializable values.
        """
        return {
            "num_words": self.num_words,
            "filters": self.filters,
            "lower": self.lower,
            "split": self.split,
            "char_level": self.char_level,
            "oov_token": self.oov_token,
            "document_count": self.document_count,
            "word_counts": json.dumps(self.word_counts),
            "word_docs": json.dumps(self.word_docs),
            "index_docs": json.dumps(self.index_docs),
            "index_word": json.dumps(self.index_word),
            "word_index": json.dumps(self.word_index),
        }

    def to_json(self, **kwargs):
        """Serializes the tokenizer to a JSON string (Keras' format).

        Args:
            **kwargs: Passed on to `json.dumps`.

        Returns:
            A JSON string; load it with `tokenizer_from_json`.
        """
        return json.dumps({"class_name": type(self).__name__, "config": self.get_config()}, **kwargs)


def tokenizer_from_json(json_string):
    """Rebuilds a `Tokenizer` from `Tokenizer.to_json()` output.

    Also reads JSON written by Keras' `Tokenizer.to_json()`. Unlike Keras, the
    restored tokenizer can be fitted further (its count dictionaries keep their
    default-dict behaviour).

    Args:
        json_string: The JSON string.

    Returns:
        A `Tokenizer` with the saved configuration and vocabulary.

    Bounds: JSON (the whole string and each of Keras' JSON-in-JSON fields) nested deeper than
    Python's recursion limit (``sys.getrecursionlimit()``, 1000 by default) is a ValueError; time and
    memory are otherwise linear in the string's length.

    Raises:
        ValueError: If the JSON does not describe a tokenizer, or nests too deeply.
        TypeError: If `json_string` is not a str or bytes.
    """
    payload = _json_value(json_string, "the tokenizer JSON")
    if not isinstance(payload, dict) or not isinstance(payload.get("config"), dict):
        raise ValueError("Expected the JSON of a Tokenizer, as written by `Tokenizer.to_json()`.")
    if payload.get("class_name") == "SubwordTokenizer":
        return SubwordTokenizer.from_config(payload["config"])
    config = dict(payload["config"])
    fields = {}
    for name, key_kind, value_kind in (("word_counts", str, int), ("word_docs", str, int), ("index_docs", int, int),
                                       ("index_word", int, str), ("word_index", str, int)):
        if name not in config:
            raise ValueError(f"Tokenizer JSON lacks the field '{name}'.")
        fields[name] = _json_mapping(config.pop(name), name, key_kind, value_kind)
    document_count = config.pop("document_count", 0)
    if isinstance(document_count, bool) or not isinstance(document_count, int) or document_count < 0:
        raise ValueError(f"Tokenizer JSON: 'document_count' must be an integer >= 0, got {document_count!r}")
    try:
        tokenizer = Tokenizer(**config)
    except TypeError as exc:  # a field Tokenizer does not take
        raise ValueError(f"Tokenizer JSON: {exc}") from None
    tokenizer.document_count = document_count
    tokenizer.word_counts = OrderedDict(fields["word_counts"])
    tokenizer.word_docs = defaultdict(int, fields["word_docs"])
    tokenizer.index_docs = defaultdict(int, fields["index_docs"])
    tokenizer.index_word = fields["index_word"]
    tokenizer.word_index = fields["word_index"]
    return tokenizer


def _json_value(text, what):
    """json.loads with every failure (bad syntax, nesting deeper than the interpreter's stack) a ValueError."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise TypeError(f"{what} must be a JSON string, got {type(text).__name__}")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply to be a tokenizer") from None
    except ValueError as exc:  # JSONDecodeError and bad UTF-8
        raise ValueError(f"{what} is not valid JSON ({exc})") from None


def _json_mapping(text, name, key_kind, value_kind):
    """One of Keras' JSON-in-JSON fields: an object of str keys (integer keys written as digits) to values of
    one kind. JSON object keys are strings, so the integer indices are turned back into ints."""
    mapping = _json_value(text, f"Tokenizer JSON field '{name}'")
    if not isinstance(mapping, dict):
        raise ValueError(f"Tokenizer JSON: '{name}' must hold an object, got {type(mapping).__name__}")
    out = {}
    for key, value in mapping.items():
        if key_kind is int:
            try:
                key = int(key)
            except ValueError:
                raise ValueError(f"Tokenizer JSON: '{name}' has the key {key!r}, expected an integer") from None
        if not isinstance(value, value_kind) or isinstance(value, bool):
            raise ValueError(f"Tokenizer JSON: '{name}'[{key!r}] must be {value_kind.__name__}, "
                             f"got {type(value).__name__}")
        out[key] = value
    return out


class SubwordTokenizer:
    """A subword vocabulary learned by SentencePiece (Kudo and Richardson 2018; BPE as Sennrich et al.
    2016, or the unigram model), so that a word never seen in training is spelt with known pieces.

    attnx keeps SentencePiece's model inside its own files (the model's bytes in `get_config`, read
    back with SentencePiece's protobuf parser, never a pickle), so a saved translator carries its
    vocabulary. Text is taken as written: case and punctuation are kept (unless `lower`), no Unicode
    normalization is applied, and runs of whitespace become one space, so that
    ``decode(encode(t)) == " ".join(t.split())`` for any text without a ``"\u2581"`` of its own.

    Characters never seen in training: with `byte_fallback` each becomes the ids of its UTF-8 bytes
    (256 ids reserved for them), so every text round-trips; without it they become ``<unk>``. The
    default turns byte fallback on when `vocab_size` >= 1024 (a vocabulary large enough that 256 byte
    ids are a small share of it) and off below.

    Args:
        vocab_size: the largest number of ids wanted, padding and the special tokens included (a small
            corpus may give fewer).
        lower: lowercase texts first.
        model_type: ``"bpe"`` or ``"unigram"``.
        byte_fallback: spell unseen characters as bytes (True), as ``<unk>`` (False), or None for the
            rule above.
        character_coverage: the share of the training text's characters that get their own id (1.0:
            all of them; SentencePiece suggests 0.9995 for Chinese or Japanese, the rare rest then
            falling back to bytes).

    Ids: 0 padding, 1 ``<unk>``, 2 ``<start>``, 3 ``<end>``, then the byte pieces (with byte fallback)
    and the learned pieces. ``word_index`` / ``index_word`` map pieces to ids and back (as `Tokenizer`'s).
    Training and encoding run in SentencePiece's C++ (linear in the text's length; training reads
    sentences of up to 4192 bytes and skips longer ones).
    """

    MARKER = "\u2581"
    SPECIAL_TOKENS = ("<unk>", "<start>", "<end>")
    MODEL_TYPES = ("bpe", "unigram")
    BYTE_FALLBACK_FROM = 1024

    def __init__(self, vocab_size=8000, lower=False, model_type="bpe", byte_fallback=None, character_coverage=1.0):
        smallest = len(self.SPECIAL_TOKENS) + 2
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < smallest:
            raise ValueError(f"SubwordTokenizer: vocab_size must be an integer >= {smallest}, got {vocab_size!r}")
        if model_type not in self.MODEL_TYPES:
            raise ValueError(f"SubwordTokenizer: model_type must be one of {self.MODEL_TYPES}, got {model_type!r}")
        if byte_fallback is None:
            byte_fallback = vocab_size >= self.BYTE_FALLBACK_FROM
        if not isinstance(byte_fallback, bool):
            raise TypeError(f"SubwordTokenizer: byte_fallback must be True, False or None, got {byte_fallback!r}")
        if byte_fallback and vocab_size < 256 + smallest:
            raise ValueError(f"SubwordTokenizer: byte_fallback needs vocab_size >= {256 + smallest} (256 byte ids), "
                             f"got {vocab_size}; pass byte_fallback=False for a smaller vocabulary")
        if isinstance(character_coverage, bool) or not isinstance(character_coverage, numbers.Real) or \
                not 0.9 <= character_coverage <= 1.0:
            raise ValueError(f"SubwordTokenizer: character_coverage must be in [0.9, 1], got {character_coverage!r}")
        self.target_vocab_size = int(vocab_size)
        self.lower = bool(lower)
        self.model_type = model_type
        self.byte_fallback = byte_fallback
        self.character_coverage = float(character_coverage)
        self._model = None     # SentencePiece's serialized model (bytes), None before fitting
        self._processor = None
        self.index_word = dict(enumerate(self.SPECIAL_TOKENS, start=1))
        self.word_index = {w: i for i, w in self.index_word.items()}

    @property
    def vocab_size(self):
        """The number of ids, padding included (the size an embedding table needs)."""
        return len(self.index_word) + 1

    @property
    def unk_id(self):
        return self.word_index["<unk>"]

    def _text(self, text):
        if not isinstance(text, str):
            raise TypeError(f"SubwordTokenizer: texts must be str, got {type(text).__name__}")
        text = " ".join(text.split())
        return text.lower() if self.lower else text

    def fit_on_texts(self, texts):
        """Learns the vocabulary of `texts` (an iterable of str), replacing any earlier one. Returns self."""
        import io
        import os

        import sentencepiece
        sentences = [t for t in (self._text(t) for t in texts) if t]
        if not sentences:
            raise ValueError("SubwordTokenizer: fit_on_texts needs at least one non-blank text")
        model = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=model, vocab_size=self.target_vocab_size,
                model_type=self.model_type, byte_fallback=self.byte_fallback,
                character_coverage=self.character_coverage, normalization_rule_name="identity",
                hard_vocab_limit=False, split_digits=True, num_threads=max(1, min(os.cpu_count() or 1, 8)),
                pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece="<pad>", unk_piece="<unk>",
                bos_piece="<start>", eos_piece="<end>", minloglevel=2)
        except RuntimeError as exc:
            raise ValueError(f"SubwordTokenizer: SentencePiece could not learn a vocabulary of "
                             f"{self.target_vocab_size} from these texts ({exc})") from None
        self._load(model.getvalue())
        return self

    def _load(self, model):
        import sentencepiece
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model)
        except (RuntimeError, OSError) as exc:
            raise ValueError(f"SubwordTokenizer: not a SentencePiece model ({exc})") from None
        pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        if pieces[:4] != ["<pad>", *self.SPECIAL_TOKENS]:
            raise ValueError(f"SubwordTokenizer: the model's first ids are {pieces[:4]}, expected "
                             f"['<pad>', '<unk>', '<start>', '<end>']")
        self._model, self._processor = bytes(model), processor
        self.index_word = dict(enumerate(pieces[1:], start=1))
        self.word_index = {w: i for i, w in self.index_word.items()}

    def _require_fitted(self):
        if self._processor is None:
            raise RuntimeError("SubwordTokenizer: call fit_on_texts first (or load a fitted tokenizer)")
        return self._processor

    def tokenize(self, text):
        """The subword strings of a text."""
        return self._require_fitted().encode(self._text(text), out_type=str)

    def encode(self, text):
        """The ids of a text's subwords (no start / end tokens)."""
        return self._require_fitted().encode(self._text(text))

    def texts_to_sequences(self, texts):
        """The ids of each text (one C++ call for the whole list)."""
        return self._require_fitted().encode([self._text(t) for t in texts])

    def decode(self, ids):
        """The text of ids: padding and the start / end tokens dropped, the spaces restored."""
        processor = self._require_fitted()
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise TypeError(f"SubwordTokenizer: decode takes a sequence of integer ids, got {ids.dtype} of shape "
                            f"{ids.shape}")
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise ValueError(f"SubwordTokenizer: id {int(bad[0])} is not in the vocabulary (size {self.vocab_size})")
        kept = ids[ids > self.word_index["<end>"]]
        return processor.decode(kept.tolist())

    def sequences_to_texts(self, sequences):
        return [self.decode(s) for s in sequences]

    @classmethod
    def piece_words(cls, pieces):
        """The word each piece belongs to (a word starts at each piece with SentencePiece's marker, which
        is dropped), one per piece: ``["▁I", "▁am", "▁hung", "ry."]`` -> ``["I", "am", "hungry.", "hungry."]``;
        special tokens (``<end>``) are words of their own."""
        starts = [i for i, piece in enumerate(pieces) if piece.startswith(cls.MARKER) or piece in cls.SPECIAL_TOKENS
                  or i == 0 or pieces[i - 1] in cls.SPECIAL_TOKENS]
        words = []
        for lo, hi in zip(starts, starts[1:] + [len(pieces)]):
            word = "".join(pieces[lo:hi]).replace(cls.MARKER, " ").strip()
            words += [word] * (hi - lo)
        return words

    def get_config(self):
        """The arguments and, once fitted, SentencePiece's model as base64 text (a few hundred KB at 8k ids)."""
        import base64
        return {"vocab_size": self.target_vocab_size, "lower": self.lower, "model_type": self.model_type,
                "byte_fallback": self.byte_fallback, "character_coverage": self.character_coverage,
                "model": None if self._model is None else base64.b64encode(self._model).decode("ascii")}

    @classmethod
    def from_config(cls, config):
        import base64
        import binascii
        if not isinstance(config, dict) or "merges" in config:
            raise ValueError("SubwordTokenizer: not the config of a SubwordTokenizer"
                             + (" (this one is attnx 0.1's pure-Python BPE, which SentencePiece replaced: "
                                "retrain the tokenizer and its model)" if isinstance(config, dict) else ""))
        arguments = {k: config[k] for k in ("vocab_size", "lower", "model_type", "byte_fallback", "character_coverage")
                     if k in config}
        tokenizer = cls(**arguments)
        model = config.get("model")
        if model is not None:
            if not isinstance(model, str):
                raise ValueError(f"SubwordTokenizer: `model` must be base64 text, got {type(model).__name__}")
            try:
                tokenizer._load(base64.b64decode(model, validate=True))
            except binascii.Error as exc:
                raise ValueError(f"SubwordTokenizer: `model` is not base64 ({exc})") from None
        return tokenizer

    def to_json(self, **kwargs):
        """Serializes the tokenizer to a JSON string; `tokenizer_from_json` reads it back."""
        return json.dumps({"class_name": type(self).__name__, "config": self.get_config()}, **kwargs)


def pad_sequences(sequences, maxlen=None, dtype="int32", padding="pre", truncating="pre", value=0.0):
    """Pads sequences to the same length, as `keras.utils.pad_sequences`.

    Turns a list of `num_samples` sequences into an array of shape
    `(num_samples, maxlen)` (or `(num_samples, maxlen) + sample_shape` when the
    sequence items are themselves arrays). Shorter sequences are filled with
    `value`, longer ones are cut, both at the start (`"pre"`, the default) or
    at the end (`"post"`).

    >>> pad_sequences([[1], [2, 3], [4, 5, 6]])
    array([[0, 0, 1],
           [0, 2, 3],
           [4, 5, 6]], dtype=int32)

    Args:
        sequences: List (anything with a length) of sequences; empty
            sequences give a row of `value`.
        maxlen: Length of the output rows; defaults to the longest sequence.
        dtype: Output dtype. Values are converted with NumPy (floats are
            truncated toward zero for integer dtypes). Use `object` to pad
            variable-length strings.
        padding: `"pre"` or `"post"`: where to add `value`.
        truncating: `"pre"` or `"post"`: where to cut sequences longer than
            `maxlen`.
        value: Padding value (a number, or a string for string/object dtypes).

    Returns:
        A NumPy array of dtype `dtype`.

    Raises:
        ValueError: If `padding` / `truncating` is not `"pre"` / `"post"`
            (checked up front; Keras only checks when a sequence is non-empty),
            if `sequences` or one of its items has no length, if `maxlen` is
            negative, or `maxlen` is None and there are no sequences, if a
            string `value` is used with a non-string dtype, or if the items of
            the sequences have inconsistent shapes.
        TypeError: If `maxlen` is not an integer.
    """
    if padding not in _PAD_POSITIONS:
        raise ValueError(f'Padding type "{padding}" not understood; expected "pre" or "post".')
    if truncating not in _PAD_POSITIONS:
        raise ValueError(f'Truncating type "{truncating}" not understood; expected "pre" or "post".')
    if not hasattr(sequences, "__len__"):
        raise ValueError(f"`sequences` must be a list of sequences, got {type(sequences).__name__}.")

    lengths = []
    sample_shape = None  # fixed by the first non-empty sequence
    for position, sequence in enumerate(sequences):
        if not hasattr(sequence, "__len__"):
            raise ValueError(
                f"`sequences` must be a list of iterables; found non-iterable {sequence!r} at position {position}."
            )
        if sample_shape is None and len(sequence):
            sample_shape = np.asarray(sequence).shape[1:]
        lengths.append(len(sequence))
    if sample_shape is None:
        sample_shape = ()

    if maxlen is None:
        if not lengths:
            raise ValueError("`sequences` is empty: pass `maxlen` to get an array of shape (0, maxlen).")
        maxlen = max(lengths)
    elif not isinstance(maxlen, numbers.Integral) or isinstance(maxlen, bool):
        raise TypeError(f"`maxlen` must be an int or None, got {type(maxlen).__name__}.")
    elif maxlen < 0:
        raise ValueError(f"`maxlen` must be >= 0, got {maxlen}.")
    maxlen = int(maxlen)

    is_string_dtype = np.issubdtype(dtype, np.str_) or np.issubdtype(dtype, np.bytes_)
    if isinstance(value, str) and np.dtype(dtype) != np.dtype(object) and not is_string_dtype:
        raise ValueError(
            f"`dtype` {dtype} is not compatible with `value`'s type: {type(value)}\n"
            "You should set `dtype=object` for variable length strings."
        )

    padded = np.full((len(sequences), maxlen) + sample_shape, value, dtype=dtype)
    if maxlen == 0:
        # Keras' `s[-0:]` would keep the whole sequence and fail to broadcast.
        return padded
    for position, sequence in enumerate(sequences):
        if not len(sequence):
            continue
        kept = sequence[-maxlen:] if truncating == "pre" else sequence[:maxlen]
        kept = np.asarray(kept, dtype=dtype)
        if kept.shape[1:] != sample_shape:
            raise ValueError(
                f"Shape of sample {kept.shape[1:]} of sequence at position {position} "
                f"is different from expected shape {sample_shape}"
            )
        if padding == "post":
            padded[position, : len(kept)] = kept
        else:
            padded[position, -len(kept) :] = kept
    return padded


class WordVectors(NamedTuple):
    """What `load_word_vectors` found: ``matrix`` (num_words, dim), row i the vector of the word with
    id i (row 0, the padding, zeros); ``hits`` / ``misses`` the words of the vocabulary found / not
    found in the file, ``missing`` the latter."""
    matrix: np.ndarray
    hits: int
    misses: int
    missing: list


def _parse_vector(parts, dim, path, line_number):
    if len(parts) != dim:
        raise ValueError(f"{path}, line {line_number}: a vector of {len(parts)} values, the file's vectors have "
                         f"{dim}")
    try:
        vector = np.array(parts, dtype=np.float64)
    except ValueError as exc:
        raise ValueError(f"{path}, line {line_number}: not a number ({exc})") from exc
    if not np.all(np.isfinite(vector)):
        raise ValueError(f"{path}, line {line_number}: a non-finite value")
    return vector


def load_word_vectors(path, tokenizer, num_words=None, oov="normal", seed=None, dtype="float32", encoding="utf-8"):
    """Pretrained word vectors (GloVe or word2vec text files) as an embedding matrix aligned to a
    tokenizer's ids, for ``layers.Embedding(..., embeddings_initializer=matrix, trainable=False)``.

    Args:
        path: a text file with one ``word v1 v2 ... vd`` per line: GloVe's format, or word2vec's
            text format, whose first line is ``count dim`` (recognized and checked). Words may contain
            spaces (the last d fields are the vector).
        tokenizer: a fitted `Tokenizer` (its ``word_index``).
        num_words: rows of the matrix (ids 0 .. num_words - 1); default the tokenizer's
            ``num_words``, else ``len(word_index) + 1``.
        oov: how rows of words missing from the file start: "normal" draws from a normal
            distribution with the mean and standard deviation of all the file's values (so they are
            scaled like the found vectors), "zeros" leaves them zero.
        seed: seed of the "normal" draws (default: `attnx.backend.rng()`).
        dtype: of the matrix.

    Returns:
        `WordVectors(matrix, hits, misses, missing)`; the ``oov_token``, if any, counts as a miss.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: an empty file, a line with another number of values or a value that is not a
            finite number (its line number said), a word2vec header the file disagrees with, an
            unknown `oov`.
    """
    if oov not in ("normal", "zeros"):
        raise ValueError(f"load_word_vectors: oov must be 'normal' or 'zeros', got {oov!r}")
    if not tokenizer.word_index:
        raise ValueError("load_word_vectors: the tokenizer has no vocabulary; fit it on texts first")
    rows = num_words or tokenizer.num_words or len(tokenizer.word_index) + 1
    wanted = {word: i for word, i in tokenizer.word_index.items() if 0 < i < rows}
    found, dim, declared, count = {}, None, None, 0
    total = total_sq = 0.0
    with open(path, encoding=encoding) as f:
        for line_number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if line_number == 1:
                header = line.split()
                if len(header) == 2 and all(h.isdigit() for h in header):  # word2vec: "count dim"
                    declared, dim = int(header[0]), int(header[1])
                    if dim == 0:
                        raise ValueError(f"{path}: the word2vec header declares vectors of 0 values")
                    continue
            if dim is None:
                dim = len(line.split()) - 1
                if dim < 1:
                    raise ValueError(f"{path}, line {line_number}: a word without a vector")
            parts = line.rstrip().rsplit(maxsplit=dim)
            vector = _parse_vector(parts[1:], dim, path, line_number)
            count += 1
            total += vector.sum()
            total_sq += np.square(vector).sum()
            if parts[0] in wanted and parts[0] not in found:  # the first of repeated words, as word2vec reads
                found[parts[0]] = vector
    if count == 0:
        raise ValueError(f"{path}: no word vectors in the file")
    if declared is not None and declared != count:
        raise ValueError(f"{path}: the word2vec header declares {declared} vectors, the file holds {count}")
    matrix = np.zeros((rows, dim), dtype=dtype)
    missing = sorted((w for w in wanted if w not in found), key=wanted.get)
    if oov == "normal" and missing:
        from . import backend
        mean = total / (count * dim)
        std = np.sqrt(max(total_sq / (count * dim) - mean ** 2, 0.0))
        rng = np.random.default_rng(seed) if seed is not None else backend.rng()
        matrix[[wanted[w] for w in missing]] = rng.normal(mean, std, size=(len(missing), dim))
    for word, vector in found.items():
        matrix[wanted[word]] = vector
    return WordVectors(matrix, len(found), len(missing), missing)
