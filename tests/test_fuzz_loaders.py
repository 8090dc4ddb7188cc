"""A mutation fuzzer over the saved files of every model class (issue 43): each file's JSON header is
mutated at random places (a value of another type, a huge or negative number, a deep nesting, a key
removed, a list entry repeated or dropped) and written back as a well-formed archive, so that the
mutation reaches the checks behind the zip and JSON layers; then `attnx.load_model` must load it or
raise ValueError / TypeError, and a model that loads must predict or raise ValueError / TypeError.
Never another exception type, never a hang (a minute's alarm per file; the loads take milliseconds).

The budget per class is ATTNX_FUZZ_LOADER_CASES (default 40: about 500 files, a few seconds)."""
import json
import os
import signal
import zipfile
import zlib

import numpy as np
import pytest

import attnx
from attnx import layers

CASES = int(os.environ.get("ATTNX_FUZZ_LOADER_CASES", "40"))
CORPUS = ["the cat sat on the mat .", "the dog sat on the log .", "a cat and a dog ."]
ALLOWED = (ValueError, TypeError)


@attnx.register_serializable("fuzz")
class TwoDense(attnx.Model):
    """A subclassed model holding sublayers in a list."""

    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.blocks = [layers.Dense(units, activation="tanh"), layers.Dense(2)]

    def call(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def _sequential():
    model = attnx.Sequential([layers.Embedding(12, 4, input_shape=(5,)), layers.LSTM(6, return_sequences=True),
                              layers.AttentionPooling(), layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    return model, np.arange(10).reshape(2, 5) % 12


def _functional():
    inputs = attnx.Input((5, 3))
    h = layers.Bidirectional(layers.GRU(4, return_sequences=True))(layers.Masking(0.0)(inputs))
    attended = layers.MultiHeadAttention(2, 3)(h, h)
    model = attnx.Model(inputs, layers.Dense(2)(layers.GlobalAveragePooling1D()(attended)))
    model.compile("adam", "mse")
    return model, np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)


def _lstmn():
    model = attnx.Sequential([layers.Embedding(12, 4, input_shape=(5,)), layers.LSTMN(6), layers.Dense(2)])
    model.compile("adam", "mse")
    return model, np.arange(10).reshape(2, 5) % 12


def _subclassed():
    model = TwoDense(4)
    x = np.ones((2, 3), np.float32)
    model(x)
    model.compile("adam", "mse")
    return model, x


def _seq2seq():
    from attnx.seq2seq import Seq2Seq
    model = Seq2Seq(13, 13, embedding_dim=8, units=8, start_token=1, end_token=2, max_length=6)
    model.compile("adam")
    return model, np.array([[3, 4, 5, 0], [6, 7, 0, 0]])


def _transformer():
    from attnx.seq2seq import Transformer
    model = Transformer.from_texts(CORPUS, CORPUS, vocab_size=60, model_dim=8, num_heads=2, intermediate_dim=16,
                                   num_encoder_layers=1, num_decoder_layers=1, max_length=8)
    model.compile()
    return model, None


def _captioner():
    from attnx.vision import ImageCaptioner
    x = attnx.Input((5, 4))
    encoder = attnx.Model(x, layers.Dense(3, activation="tanh")(x))
    model = ImageCaptioner(encoder, (5, 4), vocab_size=9, embedding_dim=4, units=5, attention_units=3, max_length=5)
    model.compile("adam")
    return model, np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)


def _han():
    from attnx.hierarchical import HierarchicalAttentionNetwork
    model = HierarchicalAttentionNetwork(11, embedding_dim=4, word_units=3, sentence_units=2)
    model.compile("adam", "binary_crossentropy")
    return model, np.random.default_rng(0).integers(0, 11, (2, 3, 4))


def _draw():
    from attnx.draw import DRAW
    model = DRAW(8, 8, read_n=2, write_n=3, steps=2, encoder_units=4, decoder_units=4, latent_dim=2)
    model.compile()
    return model, np.random.default_rng(0).random((2, 8, 8)).astype(np.float32)


MODELS = {"Sequential": _sequential, "functional": _functional, "LSTMN": _lstmn, "subclassed": _subclassed,
          "Seq2Seq": _seq2seq, "Transformer": _transformer, "ImageCaptioner": _captioner,
          "HierarchicalAttentionNetwork": _han, "DRAW": _draw}


def _probe(model, x):
    """The loaded model in use: a translation, or a prediction of a valid batch."""
    if x is None:  # the Transformer: text when its file kept the tokenizers (they are optional), else ids
        if model.source_tokenizer is not None and model.target_tokenizer is not None:
            return model.translate_batch(["the cat sat ."])
        return model.predict(np.array([[5, 6, 7]]), verbose=0)
    return model.predict(x, verbose=0)


# ----------------------------------------------------------------------------- mutations
def _paths(value, prefix=()):
    """Every place in a JSON value: (path, value)."""
    yield prefix, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, prefix + (i,))


def _replacements(rng, value):
    deep = 0
    for _ in range(int(rng.integers(50, 900))):  # json.dumps itself recurses: stay under its limit
        deep = [deep]
    return [None, True, -1, 0, 1, 2 ** 40, -2 ** 40, 2.5, float("1e300"), "", "x" * 10_000, "<unk>", [], {},
            [value, value], {"class_name": "Dense", "config": {}}, deep, "float16", "int8", "../x"]


def _mutated(header, rng):
    """A deep copy of `header` with one random mutation, and a label naming it."""
    header = json.loads(json.dumps(header))
    places = [(p, v) for p, v in _paths(header) if p and p[0] in ("model", "compile", "optimizer_state")]
    path, value = places[int(rng.integers(len(places)))]
    parent = header
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    kind = int(rng.integers(4))
    if kind == 0 and isinstance(parent, dict):
        del parent[key]
        return header, f"delete {path}"
    if kind == 1 and isinstance(parent, list):
        parent.insert(key, value) if rng.random() < 0.5 else parent.pop(key)
        return header, f"repeat/drop {path}"
    if kind == 2 and isinstance(value, (int, float)) and not isinstance(value, bool):
        parent[key] = type(value)(value * rng.choice([-1, 0, 2, 1000, 10 ** 9]))
        return header, f"scale {path}"
    options = _replacements(rng, value)
    choice = options[int(rng.integers(len(options)))]
    parent[key] = choice
    return header, f"set {path} = {str(choice)[:40]}"


def _rewrite(data, header):
    """The archive `data` with its JSON header replaced (every other member kept, stored, fresh CRCs)."""
    import io
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for info in src.infolist():
            blob = json.dumps(header).encode() if info.filename == "attnx.json" else src.read(info.filename)
            zf.writestr(info.filename, blob)
    return out.getvalue()


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


@pytest.mark.parametrize("name", list(MODELS))
def test_mutated_files_load_or_raise_typed_errors(name, tmp_path):
    attnx.set_random_seed(0)
    model, x = MODELS[name]()
    path = tmp_path / "model.attnx"
    model.save(path)
    data = path.read_bytes()
    header = json.loads(zipfile.ZipFile(path).read("attnx.json"))
    _probe(attnx.load_model(path), x)  # the unmutated file loads and runs
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # the same mutations in every run
    findings, outcomes = [], {"loaded": 0, "refused": 0}
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for case in range(CASES):
            mutated, label = _mutated(header, rng)
            path.write_bytes(_rewrite(data, mutated))
            stage = "load_model"
            signal.alarm(60)
            try:
                loaded = attnx.load_model(path)
                stage = "use"
                _probe(loaded, x)
                outcomes["loaded"] += 1
            except ALLOWED:
                outcomes["refused"] += 1
            except _Hang:
                findings.append(f"{label}: {stage} hung")
            except RecursionError as exc:  # noqa: PERF203 - a finding, reported below
                findings.append(f"{label}: {stage} raised RecursionError: {str(exc)[:100]}")
            except Exception as exc:  # noqa: BLE001 - every other type is a finding
                findings.append(f"{label}: {stage} raised {type(exc).__name__}: {str(exc)[:150]}")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    print(name, outcomes)
    assert outcomes["refused"] > 0  # the mutations reach the checks
    assert not findings, "\n".join(findings)
