"""Loaders for the small real-text data sets used by attnx' examples and tests.

* `load_uci_sentiment`: UCI "Sentiment Labelled Sentences" (Kotzias et al.,
  KDD 2015): 1000 labelled sentences each from amazon, yelp and imdb.
* `load_anki_pairs`: Tatoeba/Anki sentence pairs in the manythings.org format
  (e.g. English-Marathi `mar.txt`), preprocessed as in the TensorFlow
  "neural machine translation with attention" tutorial.
* `load_digit_captions`: images of a few handwritten digits side by side,
  captioned left to right ("seven two nine"), composed on the fly from
  scikit-learn's 8x8 digits (no download).

attnx ships no data. A loader looks for its files, in this order, in the
`data_dir` argument, in the folder named by the environment variable
`ATTNX_DATA_DIR`, and in the attnx cache (`ATTNX_CACHE_DIR`, default
`~/.cache/attnx`); the UCI data set is downloaded from its official source
into the cache when it is found nowhere else.
"""

from __future__ import annotations

import codecs
import functools
import os
import re
import tempfile
import unicodedata
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = [
    "AnkiSplits",
    "DATA_DIR_ENV",
    "CACHE_DIR_ENV",
    "DIGIT_CAPTION_VOCABULARY",
    "DigitCaptions",
    "SentencePairs",
    "UCI_SENTIMENT_FILES",
    "UCI_SENTIMENT_URL",
    "download_file",
    "get_cache_dir",
    "load_anki_pairs",
    "load_digit_captions",
    "load_uci_sentiment",
    "preprocess_sentence",
]

DATA_DIR_ENV = "ATTNX_DATA_DIR"
CACHE_DIR_ENV = "ATTNX_CACHE_DIR"

UCI_SENTIMENT_URL = (
    "https://archive.ics.uci.edu/ml/machine-learning-databases/00331/sentiment%20labelled%20sentences.zip"
)
UCI_SENTIMENT_SUBDIR = "uci-sentiment"
UCI_SENTIMENT_FILES = {
    "amazon": "amazon_cells_labelled.txt",
    "yelp": "yelp_labelled.txt",
    "imdb": "imdb_labelled.txt",
}

ANKI_SUBDIR = "anki"
ANKI_DEFAULT_FILE = "mar.txt"
ANKI_SOURCE_URL = "https://www.manythings.org/anki/"

_DOWNLOAD_TIMEOUT_SECONDS = 60


# --------------------------------------------------------------------------- #
# Data directory, cache and download helpers
# --------------------------------------------------------------------------- #


def get_cache_dir(subdir=""):
    """Returns the attnx cache folder (not created).

    Args:
        subdir: Optional sub-folder name, e.g. `"uci-sentiment"`.

    Returns:
        `Path($ATTNX_CACHE_DIR or ~/.cache/attnx) / subdir`.
    """
    root = os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "attnx"
    return Path(root).expanduser() / subdir


def download_file(url, destination):
    """Downloads `url` to `destination` atomically.

    The bytes go to a temporary file beside `destination`, which is then
    renamed with `os.replace`, so an interrupted download never leaves a
    partial file under the final name.

    Args:
        url: The URL to fetch.
        destination: Target file path; its folder is created if needed.

    Returns:
        `destination` as a `Path`.

    Raises:
        OSError: If the download or the write fails (`urllib.error.URLError`
            is an `OSError`).
    """
    import urllib.request  # imported here: it pulls in ssl and socket, which `import attnx` does not need

    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_SECONDS) as response:
        _write_atomically(destination, response.read())
    return destination


def _write_atomically(destination, payload):
    """Writes bytes to a temporary file beside `destination`, then renames it."""
    handle, temporary = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(payload)
        os.replace(temporary, destination)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _find_file(directory, filename, subdir):
    """Returns `directory/filename` or `directory/subdir/filename` if it exists."""
    directory = Path(directory).expanduser()
    for candidate in (directory / filename, directory / subdir / filename):
        if candidate.is_file():
            return candidate
    return None


def _decode_line(raw_line):
    """Decodes one line as UTF-8, falling back to Latin-1 for legacy bytes.

    Latin-1 never fails, so a single stray legacy byte (such as a Windows
    0x85 ellipsis) becomes one character instead of aborting the load.
    """
    try:
        return raw_line.decode("utf-8")
    except UnicodeDecodeError:
        return raw_line.decode("latin-1")


def _read_lines(path):
    """Yields `(line_number, line)` for the non-blank lines of a text file.

    Lines are split on '\\n' only: `str.splitlines()` would also split on
    U+0085, U+2028 and other characters that occur inside imdb sentences.
    Trailing whitespace (including a Windows '\\r') is stripped.
    """
    raw = Path(path).read_bytes()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    for line_number, raw_line in enumerate(raw.split(b"\n"), start=1):
        line = _decode_line(raw_line).rstrip()
        if line:
            yield line_number, line


# --------------------------------------------------------------------------- #
# UCI Sentiment Labelled Sentences
# --------------------------------------------------------------------------- #


def _uci_missing_message(filename, cache_dir, reason):
    return (
        f"{reason}\n"
        f"Provide '{filename}' (UCI Sentiment Labelled Sentences) in one of three ways:\n"
        f"  1. pass data_dir=<folder containing {filename}>;\n"
        f"  2. set the environment variable {DATA_DIR_ENV} to such a folder;\n"
        f"  3. let attnx download {UCI_SENTIMENT_URL} once into the cache {cache_dir} "
        f"(needs network access; set {CACHE_DIR_ENV} to move the cache)."
    )


def _fetch_uci_sentiment(cache_dir):
    """Downloads the official UCI zip (once) and extracts the three files into `cache_dir`."""
    archive = cache_dir / "sentiment labelled sentences.zip"
    if not archive.is_file():
        download_file(UCI_SENTIMENT_URL, archive)
    wanted = set(UCI_SENTIMENT_FILES.values())
    try:
        with zipfile.ZipFile(archive) as zipped:
            for member in zipped.namelist():
                name = member.rsplit("/", 1)[-1]
                # The archive also holds macOS resource forks (__MACOSX/._name).
                if name in wanted and not member.startswith("__MACOSX"):
                    _write_atomically(cache_dir / name, zipped.read(member))
    except zipfile.BadZipFile:
        archive.unlink(missing_ok=True)  # a later call downloads it again
        raise


def _uci_sentiment_file(source, data_dir):
    """Finds (or downloads) the file of one UCI source, in the documented order."""
    filename = UCI_SENTIMENT_FILES[source]
    cache_dir = get_cache_dir(UCI_SENTIMENT_SUBDIR)
    if data_dir is not None:
        found = _find_file(data_dir, filename, UCI_SENTIMENT_SUBDIR)
        if found is None:
            raise FileNotFoundError(
                _uci_missing_message(filename, cache_dir, f"'{filename}' was not found in data_dir='{data_dir}'.")
            )
        return found
    env_dir = os.environ.get(DATA_DIR_ENV)
    if env_dir:
        found = _find_file(env_dir, filename, UCI_SENTIMENT_SUBDIR)
        if found is not None:
            return found
    cached = cache_dir / filename
    if not cached.is_file():
        try:
            _fetch_uci_sentiment(cache_dir)
        except Exception as error:
            raise FileNotFoundError(
                _uci_missing_message(
                    filename, cache_dir, f"'{filename}' was not found and downloading it failed: {error}"
                )
            ) from error
        if not cached.is_file():
            raise FileNotFoundError(
                _uci_missing_message(filename, cache_dir, f"The downloaded archive does not contain '{filename}'.")
            )
    return cached


def _read_labelled_sentences(path):
    """Reads `sentence<TAB>label` lines; returns (sentences, labels)."""
    sentences, labels = [], []
    for line_number, line in _read_lines(path):
        # Never a CSV parser: imdb sentences contain unbalanced quotes.
        sentence, tab, label = line.rpartition("\t")
        if not tab or label.strip() not in ("0", "1"):
            raise ValueError(
                f"{path}, line {line_number}: expected 'sentence<TAB>0' or 'sentence<TAB>1', got {line!r}."
            )
        sentences.append(sentence.strip())
        labels.append(int(label))
    return sentences, labels


def load_uci_sentiment(sources=("amazon", "yelp", "imdb"), data_dir=None):
    """Loads the UCI Sentiment Labelled Sentences data set.

    Each source file has one `sentence<TAB>label` per line, label 1 for
    positive and 0 for negative; every source has 500 of each. Files are read
    line by line (never with a CSV parser: imdb sentences contain unbalanced
    quotes), split on '\\n' only (imdb sentences contain U+0085, which
    `str.splitlines()` treats as a line break), with trailing whitespace
    stripped and blank lines skipped.

    Files are looked up, per source, in `data_dir` (if given, nowhere else),
    then in `$ATTNX_DATA_DIR`, then in the cache
    (`$ATTNX_CACHE_DIR/uci-sentiment`, default `~/.cache/attnx/uci-sentiment`);
    failing that the official UCI zip is downloaded once into the cache. In a
    folder, the file may sit directly or in a `uci-sentiment/` sub-folder.

    Args:
        sources: Source names among `"amazon"`, `"yelp"`, `"imdb"` (or one
            name as a string), concatenated in the given order.
        data_dir: Optional folder holding the `*_labelled.txt` files.

    Bounds: none beyond the files: each file is read once, in time and
    memory linear in its size (lines of any length).

    Returns:
        `(sentences, labels)`: a list of str and an int64 array of 0/1, in
        file order.

    Raises:
        ValueError: For an unknown, repeated or empty list of source names, or
            a malformed line.
        FileNotFoundError: If a file is missing from `data_dir`, or cannot be
            found nor downloaded; the message names the file and the three
            ways to provide it.
    """
    if isinstance(sources, str):
        sources = (sources,)
    sources = tuple(sources)
    unknown = [source for source in sources if source not in UCI_SENTIMENT_FILES]
    if unknown:
        raise ValueError(f"Unknown UCI sentiment source(s) {unknown}; expected some of {list(UCI_SENTIMENT_FILES)}.")
    if not sources:
        raise ValueError(f"`sources` is empty; expected some of {list(UCI_SENTIMENT_FILES)}.")
    if len(set(sources)) != len(sources):
        raise ValueError(f"`sources` repeats a source: {list(sources)}.")

    sentences, labels = [], []
    for source in sources:
        source_sentences, source_labels = _read_labelled_sentences(_uci_sentiment_file(source, data_dir))
        sentences.extend(source_sentences)
        labels.extend(source_labels)
    return sentences, np.asarray(labels, dtype=np.int64)


# --------------------------------------------------------------------------- #
# Anki / manythings.org sentence pairs
# --------------------------------------------------------------------------- #


class SentencePairs(NamedTuple):
    """Aligned source and target sentences of one split."""

    source: list
    target: list


class AnkiSplits(NamedTuple):
    """Train / validation / test splits returned by `load_anki_pairs`."""

    train: SentencePairs
    val: SentencePairs
    test: SentencePairs


# The Devanagari danda '।' ends Marathi and Hindi sentences like '.' does.
_PUNCTUATION_MARKS = "?.!,¿।"
_PUNCTUATION = re.compile(f"([{re.escape(_PUNCTUATION_MARKS)}])")


def preprocess_sentence(sentence):
    """Normalizes one sentence as the TensorFlow NMT-with-attention tutorial.

    Unicode NFC normalization, lowercasing, a space on both sides of
    `? . ! , ¿ ।`, runs of whitespace collapsed to one space, then
    `<start>` / `<end>` tokens added:

    >>> preprocess_sentence("May I borrow this book?")
    '<start> may i borrow this book ? <end>'

    The tutorial's NFD decomposition followed by dropping every combining mark
    (category Mn) only strips accents from Latin letters; in Devanagari
    several vowel signs (ु ू े ै), the virama ् and the anusvara ं are
    combining marks, so it would turn Marathi words into different, misspelt
    ones ("पुस्तक" would become "पसतक", "मुंबई" "मबई"). NFC keeps them and
    still makes canonically equal strings compare equal. Its final step, which drops every character
    outside a-z and the punctuation above, is not applied for the same reason.

    Args:
        sentence: The raw sentence.

    Returns:
        The preprocessed sentence, tokens separated by single spaces.
    """
    text = unicodedata.normalize("NFC", sentence.lower())
    tokens = _PUNCTUATION.sub(r" \1 ", text).split()
    return " ".join(["<start>", *tokens, "<end>"])


def _word_count(preprocessed):
    """Counts the words of a preprocessed sentence: no punctuation marks, no <start>/<end>."""
    return sum(token not in _PUNCTUATION_MARKS for token in preprocessed.split()[1:-1])


def _anki_file(path, data_dir):
    """Resolves the Anki file from `path`, `data_dir` or `$ATTNX_DATA_DIR`."""
    how_to = (
        f"Provide it with path=<file>, data_dir=<folder containing {ANKI_DEFAULT_FILE}>, or the environment "
        f"variable {DATA_DIR_ENV}; download the pairs from {ANKI_SOURCE_URL} (e.g. mar-eng.zip)."
    )
    if path is not None:
        if data_dir is not None:
            raise ValueError("Pass either `path` or `data_dir`, not both.")
        if not Path(path).expanduser().is_file():
            raise FileNotFoundError(f"Anki file '{path}' does not exist. {how_to}")
        return Path(path).expanduser()
    if data_dir is not None:
        found = _find_file(data_dir, ANKI_DEFAULT_FILE, ANKI_SUBDIR)
        if found is None:
            raise FileNotFoundError(f"'{ANKI_DEFAULT_FILE}' was not found in data_dir='{data_dir}'. {how_to}")
        return found
    env_dir = os.environ.get(DATA_DIR_ENV)
    found = _find_file(env_dir, ANKI_DEFAULT_FILE, ANKI_SUBDIR) if env_dir else None
    if found is None:
        raise FileNotFoundError(f"No Anki sentence-pair file '{ANKI_DEFAULT_FILE}' was found. {how_to}")
    return found


def _check_positive_int(name, value):
    if value is None:
        return
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be a positive int or None, got {type(value).__name__}.")
    if value < 1:
        raise ValueError(f"`{name}` must be a positive int or None, got {value}.")


def _check_split(split):
    try:
        fractions = [float(fraction) for fraction in split]
    except (TypeError, ValueError):
        raise TypeError(f"`split` must be three fractions (train, val, test), got {split!r}.") from None
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(
            f"`split` must be three non-negative fractions (train, val, test) summing to 1, got {split!r}."
        )
    return fractions


def load_anki_pairs(
    path=None,
    data_dir=None,
    max_words=None,
    num_examples=None,
    reverse=False,
    split=(0.8, 0.1, 0.1),
    seed=0,
    raw=False,
):
    """Loads and preprocesses Anki / manythings.org sentence pairs.

    Each line of the file is `English<TAB>translation<TAB>attribution` (the
    attribution column may be missing). Both sentences go through
    `preprocess_sentence` (the tutorial's lowercased, punctuation-split text
    between `<start>` and `<end>`), or are kept as written with `raw=True`
    (what a subword translator such as `attnx.seq2seq.Transformer` reads and
    what cased sacreBLEU scores). The pairs are shuffled deterministically with
    `seed` and cut into train / val / test; `raw` changes only the text, not
    which pairs are kept or where they go.

    Args:
        path: The pair file itself (any language).
        data_dir: A folder holding `mar.txt` (directly or in `anki/`).
            Without `path` and `data_dir`, `$ATTNX_DATA_DIR` is searched.
        max_words: Keep only pairs whose two sentences both have at most this
            many words. Words are the tokens of the preprocessed sentence
            other than `<start>`, `<end>` and the punctuation marks split off
            by `preprocess_sentence`, so "I forgot." has 2.
        num_examples: Keep only the first `num_examples` pairs (in file order,
            after the `max_words` filter). The manythings files are sorted by
            length, so these are the shortest pairs.
        reverse: By default English is the source and the translation the
            target; `True` swaps them.
        split: Fractions `(train, val, test)` summing to 1. The val and test
            sizes are `floor(n * fraction)`; train gets the rest.
        seed: Seed of the shuffle (`numpy.random.default_rng`).
        raw: Keep each sentence as written (surrounding whitespace stripped)
            instead of preprocessing it.

    Bounds: `max_words` and `num_examples` only filter, so any positive int
    is accepted; the file is read once, in time and memory linear in its
    size (lines of any length).

    Returns:
        An `AnkiSplits(train, val, test)`; each is a
        `SentencePairs(source, target)` of two aligned lists of str.

    Raises:
        FileNotFoundError: If the file cannot be found.
        ValueError: For a malformed line, both `path` and `data_dir`, or bad
            `max_words` / `num_examples` / `split` values.
        TypeError: For arguments of the wrong type.
    """
    _check_positive_int("max_words", max_words)
    _check_positive_int("num_examples", num_examples)
    if not isinstance(raw, bool):
        raise TypeError(f"`raw` must be True or False, got {raw!r}.")
    fractions = _check_split(split)
    file = _anki_file(path, data_dir)

    sources, targets = [], []
    for line_number, line in _read_lines(file):
        if num_examples is not None and len(sources) == num_examples:
            break
        fields = line.split("\t")
        if len(fields) < 2:
            raise ValueError(
                f"{file}, line {line_number}: expected 'English<TAB>translation<TAB>attribution', got {line!r}."
            )
        english, translation = preprocess_sentence(fields[0]), preprocess_sentence(fields[1])
        if max_words is not None and max(_word_count(english), _word_count(translation)) > max_words:
            continue
        if raw:
            english, translation = fields[0].strip(), fields[1].strip()
        source, target = (translation, english) if reverse else (english, translation)
        sources.append(source)
        targets.append(target)

    count = len(sources)
    # The epsilon keeps e.g. 100 * 0.29 = 28.999999999999996 from flooring to 28.
    val_size = int(count * fractions[1] + 1e-9)
    test_size = int(count * fractions[2] + 1e-9)
    train_size = count - val_size - test_size
    order = np.random.default_rng(seed).permutation(count)
    bounds = [(0, train_size), (train_size, train_size + val_size), (train_size + val_size, count)]
    return AnkiSplits(
        *(
            SentencePairs([sources[i] for i in order[start:stop]], [targets[i] for i in order[start:stop]])
            for start, stop in bounds
        )
    )


# ----------------------------------------------------------------------------- digit captions
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# token id -> word: 0 padding, 1 start, 2 end, then the digits (digit d is id d + 3)
DIGIT_CAPTION_VOCABULARY = ("<pad>", "<start>", "<end>") + DIGIT_WORDS
_DIGIT_SIZE = 8  # scikit-learn's digits are 8x8
_DIGIT_TEST_FRACTION = 0.2  # split="test": this share of the 1797 digit images, the same for every seed


class DigitCaptions(NamedTuple):
    """Composed digit images and their captions (see `load_digit_captions`).

    images: (N, H, W, 1) float32 in [0, 1]; digits: (N, k) the digits left to right;
    captions: N strings ("seven two nine"); tokens: (N, k + 2) int64 ids ``<start> words <end>``
    in `vocabulary`; boxes: (N, k, 4) int64 ``(top, left, bottom, right)`` of each digit's 8x8
    square (bottom and right exclusive); vocabulary: token id -> word.
    """

    images: np.ndarray
    digits: np.ndarray
    captions: list
    tokens: np.ndarray
    boxes: np.ndarray
    vocabulary: tuple


def attended_box(attention, boxes, grid, window, stride):
    """Which box each step's attention looked at: for attention over the regions of a feature map,
    (N, steps, L) with L = rows x cols of `grid` and region r seeing the `window` x `window` square
    of the image at (r // cols * stride, r % cols * stride), the index of the box in `boxes`
    (N, k, 4), ``(top, left, bottom, right)`` as `DigitCaptions.boxes`, that overlaps the square of the
    step's most-attended region most; -1 where none overlaps it. Returns (N, steps) int64."""
    attention, boxes = np.asarray(attention), np.asarray(boxes)
    region = attention.argmax(-1)
    top, left = region // grid[1] * stride, region % grid[1] * stride
    box = boxes[:, None, :, :]  # (N, 1, k, 4) against the (N, steps, 1) squares
    rows = np.minimum(top[..., None] + window, box[..., 2]) - np.maximum(top[..., None], box[..., 0])
    cols = np.minimum(left[..., None] + window, box[..., 3]) - np.maximum(left[..., None], box[..., 1])
    overlap = np.clip(rows, 0, None) * np.clip(cols, 0, None)
    return np.where(overlap.max(-1) > 0, overlap.argmax(-1), -1)


@functools.lru_cache(maxsize=1)
def _sklearn_digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("attnx.datasets.load_digit_captions composes scikit-learn's 8x8 digits: install "
                          "scikit-learn (pip install 'attnx[vision]')") from None
    digits = load_digits()
    return (digits.images / 16.0).astype(np.float32), digits.target.astype(np.int64)


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__}.")
    if value < low:
        raise ValueError(f"`{name}` must be >= {low}, got {value}.")
    return int(value)


MAX_CANVAS_SIDE = 4096  # load_digit_captions' canvas
MAX_PIXELS = 2 ** 31 - 1  # load_digit_captions' images together: the kernels' index limit


def load_digit_captions(n, canvas=(16, 48), digits_per_image=3, seed=0, min_gap=1, split=None):
    """Images of `digits_per_image` handwritten digits placed at random on a blank canvas, left to
    right with at least `min_gap` blank columns between them, captioned with their names left to
    right. Made on the fly from scikit-learn's 8x8 digits; the same arguments give the same data.

    Args:
        n: number of images.
        canvas: (height, width) in pixels; every digit's 8x8 square must fit (height >= 8 and
            width >= 8 k + min_gap (k - 1)).
        digits_per_image: k, the digits (words) per image.
        seed: seed of the placements and the choice of digit images.
        min_gap: fewest blank columns between neighbouring digits.
        split: None (all 1797 digit images), "train" or "test": a fixed 80 / 20 partition of the
            digit images, so that test images show handwriting never seen in training.

    Bounds: the canvas sides at most `MAX_CANVAS_SIDE` = 4096 pixels and the images at most
    `MAX_PIXELS` = 2**31 - 1 pixels together (n * height * width), so that memory stays what the
    arguments ask for and within what the kernels index.

    Returns:
        `DigitCaptions` (images, digits, captions, tokens, boxes, vocabulary).
    """
    n = _check_int("n", n, 1)
    k = _check_int("digits_per_image", digits_per_image, 1)
    gap = _check_int("min_gap", min_gap, 0)
    try:
        height, width = (int(v) for v in canvas)
    except (TypeError, ValueError):
        raise TypeError(f"`canvas` must be (height, width), got {canvas!r}.") from None
    if max(height, width) > MAX_CANVAS_SIDE:
        raise ValueError(f"`canvas` sides must be <= {MAX_CANVAS_SIDE} pixels, got {(height, width)}.")
    if n * height * width > MAX_PIXELS:
        raise ValueError(f"{n} images of {height} x {width} are more than MAX_PIXELS = {MAX_PIXELS} pixels; "
                         "make fewer or smaller images.")
    needed = _DIGIT_SIZE * k + gap * (k - 1)
    if height < _DIGIT_SIZE or width < needed:
        raise ValueError(f"{k} digits of 8x8 pixels with min_gap={gap} need a canvas of at least (8, {needed}), "
                         f"got {(height, width)}.")
    if split not in (None, "train", "test"):
        raise ValueError(f"`split` must be None, 'train' or 'test', got {split!r}.")
    pictures, labels = _sklearn_digits()  # cached: read-only use below
    if split is not None:
        order = np.random.default_rng(0).permutation(len(labels))
        n_test = int(len(labels) * _DIGIT_TEST_FRACTION)
        keep = order[:n_test] if split == "test" else order[n_test:]
        pictures, labels = pictures[keep], labels[keep]
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, len(labels), size=(n, k))
    # left edges: the blank columns beyond the digits and gaps, cut at k sorted random points
    slack = width - needed
    cuts = np.sort(rng.integers(0, slack + 1, size=(n, k)), axis=1)
    left = cuts + np.arange(k) * (_DIGIT_SIZE + gap)
    top = rng.integers(0, height - _DIGIT_SIZE + 1, size=(n, k))
    images = np.zeros((n, height, width), dtype=np.float32)
    rows = np.arange(n)[:, None, None]
    square = np.arange(_DIGIT_SIZE)
    for j in range(k):
        ys = top[:, j, None, None] + square[None, :, None]
        xs = left[:, j, None, None] + square[None, None, :]
        images[rows, ys, xs] = pictures[chosen[:, j]]
    digits = labels[chosen]
    boxes = np.stack([top, left, top + _DIGIT_SIZE, left + _DIGIT_SIZE], axis=-1).astype(np.int64)
    tokens = np.concatenate([np.ones((n, 1), np.int64), digits + 3, np.full((n, 1), 2, np.int64)], axis=1)
    captions = [" ".join(DIGIT_WORDS[d] for d in row) for row in digits.tolist()]
    return DigitCaptions(images[..., None], digits, captions, tokens, boxes, DIGIT_CAPTION_VOCABULARY)
