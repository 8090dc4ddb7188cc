"""attnx.datasets on the real data in shared/data and on small files with the known traps.

No test touches the network: an autouse fixture replaces the download function
and points the cache at a temporary folder.
"""

import io
import os
import unicodedata
import zipfile
from pathlib import Path

import numpy as np
import pytest

from attnx import datasets
from attnx.datasets import load_anki_pairs, load_uci_sentiment, preprocess_sentence

REPO_SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _real_data_dir(filename, subdir):
    """$ATTNX_DATA_DIR if it holds `filename` (directly or in `subdir`), else <repo>/../shared/data/<subdir>."""
    env_dir = os.environ.get(datasets.DATA_DIR_ENV)
    if env_dir:
        for candidate in (Path(env_dir), Path(env_dir) / subdir):
            if (candidate / filename).is_file():
                return candidate
    return REPO_SHARED_DATA / subdir


UCI_DIR = _real_data_dir("amazon_cells_labelled.txt", "uci-sentiment")
ANKI_FILE = _real_data_dir("mar.txt", "anki") / "mar.txt"
ANKI_LINES = 44486  # lines of the shared mar.txt (Tatoeba/Anki, 2022-01-09)

real_download_file = datasets.download_file  # captured before the autouse stub replaces it


class NetworkDisabled(OSError):
    pass


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No network, an empty cache, no ATTNX_DATA_DIR; records download attempts."""
    attempts = []

    def refuse_download(url, destination):
        attempts.append(url)
        raise NetworkDisabled("network disabled in tests")

    monkeypatch.setattr(datasets, "download_file", refuse_download)
    monkeypatch.setenv(datasets.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(datasets.DATA_DIR_ENV, raising=False)
    return attempts


# --------------------------------------------------------------------------- #
# UCI sentiment: real files
# --------------------------------------------------------------------------- #


def test_real_amazon_and_yelp():
    sentences, labels = load_uci_sentiment(("amazon", "yelp"), data_dir=UCI_DIR)
    assert len(sentences) == 2000 and labels.shape == (2000,)
    assert labels.dtype == np.int64
    assert set(np.unique(labels)) == {0, 1}
    assert labels.sum() == 1000 and labels[:1000].sum() == 500  # 500 positive per source
    # First line of each file, in the order asked for.
    assert sentences[0] == "So there is no way for me to plug it in here in the US unless I go by a converter."
    assert labels[0] == 0
    assert sentences[1000] == "Wow... Loved this place." and labels[1000] == 1
    assert all(sentence and sentence == sentence.strip() and "\t" not in sentence for sentence in sentences)


def test_source_order_and_single_source_name():
    yelp_first, labels = load_uci_sentiment(("yelp", "amazon"), data_dir=UCI_DIR)
    assert yelp_first[0] == "Wow... Loved this place." and labels[0] == 1
    yelp_only, yelp_labels = load_uci_sentiment("yelp", data_dir=UCI_DIR)
    assert yelp_only == yelp_first[:1000]
    np.testing.assert_array_equal(yelp_labels, labels[:1000])


def test_data_dir_from_environment(monkeypatch, offline):
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(UCI_DIR))
    sentences, labels = load_uci_sentiment(("amazon", "yelp"))
    assert len(sentences) == 2000 and labels.sum() == 1000
    assert offline == []


def test_data_dir_may_hold_a_uci_sentiment_subfolder(tmp_path):
    subfolder = tmp_path / "uci-sentiment"
    subfolder.mkdir()
    (subfolder / "yelp_labelled.txt").write_text("Great.\t1\n", encoding="utf-8")
    assert load_uci_sentiment("yelp", data_dir=tmp_path)[0] == ["Great."]


# --------------------------------------------------------------------------- #
# UCI sentiment: line-level traps
# --------------------------------------------------------------------------- #

IMDB_TRAPS = (
    # Trailing spaces before the tab, as in the real imdb file.
    b"A very, very, very slow-moving, aimless movie about a distressed, drifting young man.  \t0\n"
    # An unbalanced quote: a CSV parser would swallow the following lines.
    b'The "plot" is "a mess.\t0\n'
    # U+0085 (NEL) in UTF-8 inside the sentence: str.splitlines() breaks there.
    b"I loved it\xc2\x85 truly.\t1\n"
    b"   \n"
    # A Windows line ending.
    b"Great acting!\t1\r\n"
    # A legacy single byte 0x85 (not valid UTF-8), read as Latin-1 U+0085.
    b"Awful\x85 just awful.\t0\n"
    b"\n\n"
)


def test_imdb_traps(tmp_path):
    (tmp_path / "imdb_labelled.txt").write_bytes(IMDB_TRAPS)
    sentences, labels = load_uci_sentiment(("imdb",), data_dir=tmp_path)
    assert sentences == [
        "A very, very, very slow-moving, aimless movie about a distressed, drifting young man.",
        'The "plot" is "a mess.',
        "I loved it\u0085 truly.",
        "Great acting!",
        "Awful\u0085 just awful.",
    ]
    np.testing.assert_array_equal(labels, [0, 0, 1, 1, 0])
    # The trap is real: splitlines() would have cut the U+0085 sentence in two.
    assert len(IMDB_TRAPS.decode("latin-1").splitlines()) > IMDB_TRAPS.count(b"\n")


def test_malformed_line_names_file_and_line(tmp_path):
    (tmp_path / "amazon_cells_labelled.txt").write_text("Fine.\t1\nno label here\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2"):
        load_uci_sentiment("amazon", data_dir=tmp_path)
    (tmp_path / "amazon_cells_labelled.txt").write_text("Fine.\t2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"amazon_cells_labelled\.txt, line 1"):
        load_uci_sentiment("amazon", data_dir=tmp_path)


# --------------------------------------------------------------------------- #
# UCI sentiment: errors, cache and download
# --------------------------------------------------------------------------- #


def test_missing_file_in_explicit_data_dir(offline):
    # The shared folder has no imdb file; an explicit data_dir never downloads.
    with pytest.raises(FileNotFoundError) as raised:
        load_uci_sentiment(("amazon", "imdb"), data_dir=UCI_DIR)
    message = str(raised.value)
    assert "imdb_labelled.txt" in message and str(UCI_DIR) in message
    assert "data_dir=" in message and datasets.DATA_DIR_ENV in message and datasets.UCI_SENTIMENT_URL in message
    assert offline == []


def test_failed_download_explains_the_three_ways(offline, tmp_path):
    with pytest.raises(FileNotFoundError) as raised:
        load_uci_sentiment("imdb")
    message = str(raised.value)
    assert "imdb_labelled.txt" in message and "network disabled in tests" in message
    assert "data_dir=" in message and datasets.DATA_DIR_ENV in message and datasets.CACHE_DIR_ENV in message
    assert str(tmp_path / "cache" / "uci-sentiment") in message
    assert isinstance(raised.value.__cause__, NetworkDisabled)
    assert offline == [datasets.UCI_SENTIMENT_URL]


def _uci_zip_bytes():
    """A zip laid out like the official one, __MACOSX resource forks included."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for source, filename in datasets.UCI_SENTIMENT_FILES.items():
            archive.writestr(f"sentiment labelled sentences/{filename}", f"{source} is good.\t1\n{source} is bad.\t0\n")
            archive.writestr(f"__MACOSX/sentiment labelled sentences/._{filename}", b"\x00\x05\x16\x07junk")
        archive.writestr("sentiment labelled sentences/readme.txt", "readme")
    return buffer.getvalue()


def test_download_once_into_cache(monkeypatch, tmp_path):
    downloads = []

    def fake_download(url, destination):
        downloads.append(url)
        Path(destination).parent.mkdir(parents=True, exist_ok=True)
        Path(destination).write_bytes(_uci_zip_bytes())
        return Path(destination)

    monkeypatch.setattr(datasets, "download_file", fake_download)
    sentences, labels = load_uci_sentiment(("imdb", "amazon"))
    assert sentences == ["imdb is good.", "imdb is bad.", "amazon is good.", "amazon is bad."]
    np.testing.assert_array_equal(labels, [1, 0, 1, 0])
    assert load_uci_sentiment("yelp")[0] == ["yelp is good.", "yelp is bad."]
    assert downloads == [datasets.UCI_SENTIMENT_URL]  # one download for all three sources
    cache = tmp_path / "cache" / "uci-sentiment"
    assert sorted(path.name for path in cache.glob("*_labelled.txt")) == sorted(datasets.UCI_SENTIMENT_FILES.values())
    assert not list(cache.glob(".*part"))


def test_environment_folder_without_the_file_falls_back_to_cache(monkeypatch, offline, tmp_path):
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(UCI_DIR))  # has no imdb file
    cache = tmp_path / "cache" / "uci-sentiment"
    cache.mkdir(parents=True)
    (cache / "imdb_labelled.txt").write_text("Cached.\t1\n", encoding="utf-8")
    assert load_uci_sentiment("imdb")[0] == ["Cached."]
    assert offline == []


def test_download_file_is_atomic(tmp_path):
    source = tmp_path / "payload.bin"
    source.write_bytes(b"\x00payload\xff")
    target = tmp_path / "out" / "copy.bin"
    # The real function (not the autouse stub) on file:// URLs: no network.
    assert real_download_file(source.as_uri(), target) == target
    assert target.read_bytes() == b"\x00payload\xff"
    with pytest.raises(OSError):
        real_download_file((tmp_path / "missing.bin").as_uri(), tmp_path / "out" / "never.bin")
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["copy.bin"]


@pytest.mark.parametrize("sources", [("amazon", "netflix"), (), ("yelp", "yelp")])
def test_bad_source_names(sources):
    with pytest.raises(ValueError, match="source"):
        load_uci_sentiment(sources, data_dir=UCI_DIR)


# --------------------------------------------------------------------------- #
# Anki pairs
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def anki_default():
    return load_anki_pairs(path=ANKI_FILE)


def test_preprocess_sentence():
    assert preprocess_sentence("  May I borrow   this book?") == "<start> may i borrow this book ? <end>"
    spanish = preprocess_sentence("¿Puedo tomar prestado este libro?")
    assert spanish == "<start> ¿ puedo tomar prestado este libro ? <end>"
    assert preprocess_sentence("Wait,\tstop!") == "<start> wait , stop ! <end>"
    # NFC: e + combining acute becomes the single code point é.
    assert preprocess_sentence("Cafe\u0301.") == "<start> caf\u00e9 . <end>"
    # Devanagari combining marks (virama, vowel sign u, anusvara) are kept; danda is split off.
    assert preprocess_sentence("मुंबईत पुस्तक आहे।") == "<start> मुंबईत पुस्तक आहे । <end>"
    assert preprocess_sentence("") == "<start> <end>"


def test_anki_split_sizes_and_tokens(anki_default):
    train, val, test = anki_default
    # floor(44486 * 0.1) = 4448 for val and test, the rest (35590) for train.
    assert (len(train.source), len(val.source), len(test.source)) == (35590, 4448, 4448)
    assert len(train.source) + len(val.source) + len(test.source) == ANKI_LINES
    for split in anki_default:
        assert len(split.source) == len(split.target)
        for sentence in split.source + split.target:
            assert sentence.startswith("<start> ") and sentence.endswith(" <end>")
            assert "  " not in sentence


def test_anki_real_pairs_preprocessed(anki_default):
    pairs = {pair for split in anki_default for pair in zip(*split)}
    assert len(pairs) > 40000
    assert ("<start> go . <end>", "<start> जा . <end>") in pairs
    # A real line ending in a danda: "He can't sing.\tउन्हें गाना नहीं आता।".
    assert ("<start> he can't sing . <end>", "<start> उन्हें गाना नहीं आता । <end>") in pairs
    targets = [target for split in anki_default for target in split.target]
    assert sum("\u094d" in target for target in targets) > 10000  # virama survives
    assert any("\u200d" in target for target in targets)  # zero-width joiner survives
    assert all(unicodedata.is_normalized("NFC", target) for target in targets[:2000])


def _all_pairs(splits):
    return sorted(pair for split in splits for pair in zip(*split))


def test_anki_shuffle_is_deterministic(anki_default):
    again = load_anki_pairs(path=ANKI_FILE, seed=0)
    assert again == anki_default
    other = load_anki_pairs(path=ANKI_FILE, seed=1)
    assert other.train.source[:50] != anki_default.train.source[:50]
    assert _all_pairs(other) == _all_pairs(anki_default)


def test_anki_reverse_swaps_source_and_target(anki_default):
    reversed_pairs = load_anki_pairs(path=ANKI_FILE, reverse=True)
    assert reversed_pairs.train.source == anki_default.train.target
    assert reversed_pairs.test.target == anki_default.test.source


def test_anki_raw_keeps_the_text_and_changes_nothing_else(anki_default):
    raw = load_anki_pairs(path=ANKI_FILE, raw=True)
    for cooked, kept in zip(anki_default, raw):
        assert [preprocess_sentence(s) for s in kept.source] == cooked.source
        assert [preprocess_sentence(s) for s in kept.target] == cooked.target
    pairs = {pair for split in raw for pair in zip(*split)}
    assert ("He can't sing.", "उन्हें गाना नहीं आता।") in pairs  # cased, punctuation attached
    short = load_anki_pairs(path=ANKI_FILE, max_words=3, raw=True, split=(1.0, 0.0, 0.0))
    assert [preprocess_sentence(s) for s in short.train.source] == \
        load_anki_pairs(path=ANKI_FILE, max_words=3, split=(1.0, 0.0, 0.0)).train.source
    with pytest.raises(TypeError, match="raw"):
        load_anki_pairs(path=ANKI_FILE, raw="yes")


def test_anki_num_examples_takes_the_first_lines():
    splits = load_anki_pairs(path=ANKI_FILE, num_examples=100, split=(0.8, 0.1, 0.1), seed=3)
    assert [len(split.source) for split in splits] == [80, 10, 10]
    first_lines = ANKI_FILE.read_text(encoding="utf-8").split("\n")[:100]
    expected = sorted(preprocess_sentence(line.split("\t")[0]) for line in first_lines)
    assert sorted(sentence for split in splits for sentence in split.source) == expected


def test_anki_max_words():
    short = load_anki_pairs(path=ANKI_FILE, max_words=2, split=(1.0, 0.0, 0.0))
    assert short.val.source == [] and short.test.source == []
    assert len(short.train.source) > 100
    pairs = set(zip(*short.train))
    # "I forgot." has 2 words: the split-off "." does not count, nor do <start>/<end>.
    assert ("<start> i forgot . <end>", "<start> मी विसरलो . <end>") in pairs
    for sentence in short.train.source + short.train.target:
        words = [token for token in sentence.split()[1:-1] if token not in "?.!,¿।"]
        assert len(words) <= 2
    # "I forgot it." (line 960) has 3 words on both sides: dropped at 2, kept at 3.
    three_words = ("<start> i forgot it . <end>", "<start> मी ते विसरलो . <end>")
    assert three_words not in pairs
    longer = load_anki_pairs(path=ANKI_FILE, max_words=3, num_examples=5000, split=(1.0, 0.0, 0.0))
    assert three_words in set(zip(*longer.train))
    assert len(longer.train.source) > len(short.train.source)


def test_anki_data_dir_and_environment(monkeypatch, tmp_path):
    (tmp_path / "anki").mkdir()
    (tmp_path / "anki" / "mar.txt").write_text(
        "Hi.\tनमस्कार.\tCC-BY 2.0 (France) Attribution: tatoeba.org\n"
        "Run!\tपळ!\n",  # older files have no attribution column
        encoding="utf-8",
    )
    from_dir = load_anki_pairs(data_dir=tmp_path, split=(1.0, 0.0, 0.0))
    assert sorted(zip(*from_dir.train)) == [
        ("<start> hi . <end>", "<start> नमस्कार . <end>"),
        ("<start> run ! <end>", "<start> पळ ! <end>"),
    ]
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path))
    assert load_anki_pairs(split=(1.0, 0.0, 0.0)) == from_dir


def test_anki_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=datasets.DATA_DIR_ENV):
        load_anki_pairs()
    with pytest.raises(FileNotFoundError, match="mar.txt"):
        load_anki_pairs(data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_anki_pairs(path=tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="not both"):
        load_anki_pairs(path=ANKI_FILE, data_dir=tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_anki_pairs(path=ANKI_FILE, split=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="split"):
        load_anki_pairs(path=ANKI_FILE, split=(0.9, 0.1))
    with pytest.raises(ValueError, match="max_words"):
        load_anki_pairs(path=ANKI_FILE, max_words=0)
    with pytest.raises(TypeError, match="num_examples"):
        load_anki_pairs(path=ANKI_FILE, num_examples="10")
    bad = tmp_path / "bad.txt"
    bad.write_text("Hello.\tनमस्कार.\nno tab here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        load_anki_pairs(path=bad)


# ----------------------------------------------------------------------------- digit captions
def test_digit_captions_are_deterministic_and_describe_the_image():
    pytest.importorskip("sklearn")
    first = datasets.load_digit_captions(50, canvas=(12, 40), digits_per_image=3, seed=7, min_gap=2)
    again = datasets.load_digit_captions(50, canvas=(12, 40), digits_per_image=3, seed=7, min_gap=2)
    other = datasets.load_digit_captions(50, canvas=(12, 40), digits_per_image=3, seed=8, min_gap=2)
    np.testing.assert_array_equal(first.images, again.images)
    assert not np.array_equal(first.images, other.images)
    assert first.images.shape == (50, 12, 40, 1) and first.images.dtype == np.float32
    assert first.images.min() >= 0 and first.images.max() <= 1
    vocab = first.vocabulary
    for image, digits, caption, tokens, boxes in zip(first.images[..., 0], first.digits, first.captions,
                                                     first.tokens, first.boxes):
        assert caption == " ".join(datasets.DIGIT_WORDS[d] for d in digits)
        assert [vocab[t] for t in tokens] == ["<start>"] + caption.split() + ["<end>"]
        # left to right, min_gap blank columns apart, inside the canvas, and all ink inside the boxes
        assert (boxes[1:, 1] - boxes[:-1, 3] >= 2).all()
        assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 12).all() and (boxes[:, 3] <= 40).all()
        inside = np.zeros(image.shape, bool)
        for top, left, bottom, right in boxes:
            inside[top:bottom, left:right] = True
            assert image[top:bottom, left:right].max() > 0
        assert image[~inside].max(initial=0) == 0


def test_digit_captions_held_out_handwriting_and_bad_arguments():
    pytest.importorskip("sklearn")
    train = datasets.load_digit_captions(400, seed=0, split="train")
    test = datasets.load_digit_captions(400, seed=0, split="test")
    crops = lambda d: {d.images[i, t:b, l:r, 0].tobytes() for i in range(len(d.images)) for t, l, b, r in d.boxes[i]}
    assert not crops(train) & crops(test)  # no digit image in both
    with pytest.raises(ValueError, match="cannot|need a canvas"):
        datasets.load_digit_captions(5, canvas=(16, 25), digits_per_image=3)
    with pytest.raises(ValueError, match="need a canvas"):
        datasets.load_digit_captions(5, canvas=(7, 48))
    with pytest.raises(ValueError, match="split"):
        datasets.load_digit_captions(5, split="validation")
    with pytest.raises(ValueError, match="`n`"):
        datasets.load_digit_captions(0)
    with pytest.raises(TypeError, match="digits_per_image"):
        datasets.load_digit_captions(5, digits_per_image=2.5)
    with pytest.raises(TypeError, match="canvas"):
        datasets.load_digit_captions(5, canvas=16)


def test_attended_box_names_the_box_under_the_most_attended_region():
    # a 2 x 4 grid of 6-pixel squares every 4 pixels over a 10 x 18 image; two boxes
    grid, window, stride = (2, 4), 6, 4
    boxes = np.array([[[0, 0, 8, 8], [2, 10, 10, 18]]])  # (1, 2, 4): top, left, bottom, right
    attention = np.zeros((1, 4, 8))
    attention[0, 0, 0] = 1.0  # square (0..6, 0..6): inside box 0 only
    attention[0, 1, 7] = 1.0  # square (4..10, 12..18): inside box 1 only
    attention[0, 2, 6] = 1.0  # square (4..10, 8..14): box 0 overlaps 4 x 0, box 1 6 x 4 -> 1
    attention[0, 3, 2] = 1.0  # square (0..6, 8..14): box 0 none (left 8 = its right), box 1 4 x 4 -> 1
    np.testing.assert_array_equal(datasets.attended_box(attention, boxes, grid, window, stride), [[0, 1, 1, 1]])
    far = np.array([[[0, 0, 8, 8], [0, 40, 8, 48]]])  # nothing under squares of columns 2-3
    assert datasets.attended_box(attention, far, grid, window, stride)[0, 2] == -1
    # each step's own argmax counts, not the sum over steps
    attention[0, 1] = [0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.6]
    assert datasets.attended_box(attention, boxes, grid, window, stride)[0, 1] == 1
