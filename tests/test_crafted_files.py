"""Crafted `.attnx` files: whatever is wrong with a file, loading raises ValueError (FileNotFoundError
for a missing path), quickly, without allocating more than the file's size.

The variants are mutations of one valid saved model, at every level a hostile file can lie: the
header (fields deleted or of another JSON type, a JSON list instead of an object, unknown loss /
optimizer / metric names, inflated shapes, dtypes NumPy has but the format does not), the `.npy`
members (complex, string, datetime, object and structured dtypes, inflated or truncated shapes,
Fortran order, unknown versions) with the header's checksum recomputed so that every check behind it
is reached, and the zip itself (deflated / bzip2 / lzma members, encrypted flag, path-traversal and
duplicate member names, declared sizes inflated, wrong CRCs, truncation).
"""
import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import warnings
import zipfile

import numpy as np
import pytest

import attnx
from attnx import layers

# A JSON value of each type a field might be retyped to.
RETYPED = [None, True, 0, -1, 1.5, "x", [], {}, [5], {"a": 1}]
# Dtypes NumPy has that the format excludes (weights are bool, integer or floating point).
FOREIGN_DTYPES = ["complex64", "<U4", "S4", "<M8[s]", "<m8[s]", "|O", [("a", "<f4"), ("b", "<f4")], ("<f4", (2,))]


def _model():
    attnx.set_random_seed(0)
    model = attnx.Sequential([layers.Embedding(12, 4, input_shape=(5,)), layers.GlobalAveragePooling1D(),
                              layers.Dense(3, activation="softmax")])
    model.compile(attnx.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    r = np.random.default_rng(0)
    model.fit(r.integers(0, 12, (8, 5)), r.integers(0, 3, 8), epochs=1, verbose=0)  # optimizer state too
    return model


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    path = tmp_path_factory.mktemp("valid") / "model.attnx"
    _model().save(path)
    return path.read_bytes()


# ----------------------------------------------------------------------------- building files
def _members(data):
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {info.filename: zf.read(info.filename) for info in zf.infolist()}


def _zip(members, compression=zipfile.ZIP_STORED):
    """A zip of `members` ({name: bytes}, or (name, bytes) pairs, which may repeat a name: zipfile's
    warning about that is what we want); `compression` maps a name to its method, or is one."""
    out = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w") as zf:
        warnings.simplefilter("ignore")
        for name, blob in members.items() if isinstance(members, dict) else members:
            method = compression.get(name, zipfile.ZIP_STORED) if isinstance(compression, dict) else compression
            zf.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0)), blob, compress_type=method)
    return out.getvalue()


def _with_header(data, change):
    """`data` with its header changed in place by `change(header)`."""
    header = json.loads(_members(data)["attnx.json"])
    change(header)
    return _with_header_text(data, json.dumps(header))


def _with_header_text(data, text):
    return _zip({**_members(data), "attnx.json": text.encode()})


def _npy(shape, descr, fortran=False, data=b"", version=b"\x01\x00"):
    """A .npy file with a header we write ourselves (np.save refuses object arrays without pickle)."""
    text = repr({"descr": descr, "fortran_order": fortran, "shape": tuple(shape)}).encode()
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    size = struct.pack("<H", len(text)) if version == b"\x01\x00" else struct.pack("<I", len(text))
    return b"\x93NUMPY" + version + size + text + data


def _with_member(data, index, blob, header_dtype=None, header_shape=None):
    """`data` with weight `index` replaced by `blob`, the header's checksum (and, when given, its dtype
    and shape) made to match, so that loading reaches the checks behind the checksum."""
    members = _members(data)
    header = json.loads(members["attnx.json"])
    entry = header["weights"][index]
    entry["sha256"] = hashlib.sha256(blob).hexdigest()
    if header_dtype is not None:
        entry["dtype"] = header_dtype
    if header_shape is not None:
        entry["shape"] = header_shape
    members["attnx.json"] = json.dumps(header).encode()
    members[f"weights/{index:05d}.npy"] = blob
    return _zip(members)


def _patch_directory(data, name, field, value):
    """`data` with one field of `name`'s central directory record (offset in the record, struct
    format) overwritten: how a file lies about sizes, methods or CRCs past zipfile's writer."""
    offset, fmt = {"flags": (8, "<H"), "method": (10, "<H"), "crc": (16, "<I"), "compressed": (20, "<I"),
                   "size": (24, "<I")}[field]
    out = bytearray(data)
    pos = 0
    while True:
        start = out.index(b"PK\x01\x02", pos)
        name_len = struct.unpack_from("<H", out, start + 28)[0]
        if out[start + 46:start + 46 + name_len].decode() == name:
            struct.pack_into(fmt, out, start + offset, value)
            return bytes(out)
        pos = start + 4


def _variants(data):
    """(label, bytes) of every crafted file."""
    header = json.loads(_members(data)["attnx.json"])
    # the header: another JSON type at the top, each field deleted or retyped
    for top in ([], [header], 5, "attnx", None):
        yield f"header is {top!r}"[:40], _with_header_text(data, json.dumps(top))
    for key in header:
        yield f"no {key}", _with_header(data, lambda h, key=key: h.pop(key))
        for value in RETYPED:
            yield f"{key}={value!r}", _with_header(data, lambda h, key=key, value=value: h.update({key: value}))
    for section, fields in (("model", ["class_name", "config"]), ("compile", ["optimizer", "loss", "metrics",
                                                                               "loss_weights"]),
                            ("optimizer_state", ["iterations", "slots"])):
        for field in fields:
            yield f"no {section}.{field}", _with_header(data, lambda h, s=section, f=field: h[s].pop(f))
            for value in RETYPED:
                yield f"{section}.{field}={value!r}", _with_header(
                    data, lambda h, s=section, f=field, v=value: h[s].update({f: v}))
    for key in ("weights", "optimizer_weights"):
        for field in ("name", "shape", "dtype", "sha256"):
            yield f"no {key}[0].{field}", _with_header(data, lambda h, k=key, f=field: h[k][0].pop(f))
            for value in RETYPED:
                yield f"{key}[0].{field}={value!r}", _with_header(
                    data, lambda h, k=key, f=field, v=value: h[k][0].update({f: v}))
        for shape in ([2_000_000_000], [2e9], [10 ** 30], [-1], [200_000_000, 4], [0], [1, 2, 3]):
            yield f"{key}[0].shape={shape}", _with_header(data, lambda h, k=key, s=shape: h[k][0].update(shape=s))
        for dtype in ("complex64", "U4", "datetime64[s]", "object", "V8", "float128", "nope"):
            yield f"{key}[0].dtype={dtype}", _with_header(data, lambda h, k=key, d=dtype: h[k][0].update(dtype=d))
        yield f"{key} one more", _with_header(data, lambda h, k=key: h[k].append(dict(h[k][0])))
        yield f"{key} one fewer", _with_header(data, lambda h, k=key: h[k].pop())
    # names this attnx does not know
    yield "unknown model class", _with_header(data, lambda h: h["model"].update(class_name="Nope"))
    yield "unknown loss class", _with_header(data, lambda h: h["compile"].update(
        loss=[{"class_name": "Nope", "config": {}}]))
    yield "loss without config", _with_header(data, lambda h: h["compile"].update(loss=[{"class_name": "MSE"}]))
    yield "no loss", _with_header(data, lambda h: h["compile"].update(loss=[]))
    yield "unknown optimizer class", _with_header(data, lambda h: h["compile"]["optimizer"].update(
        class_name="Nope"))
    yield "optimizer config retyped", _with_header(data, lambda h: h["compile"]["optimizer"].update(config=5))
    yield "unknown metric", _with_header(data, lambda h: h["compile"].update(metrics=[["nope"]]))
    yield "optimizer slot out of range", _with_header(data, lambda h: h["optimizer_state"]["slots"][0].__setitem__(
        0, 99))
    yield "optimizer slot of one index", _with_header(data, lambda h: h["optimizer_state"]["slots"].__setitem__(
        0, [0]))
    yield "negative iterations", _with_header(data, lambda h: h["optimizer_state"].update(iterations=-1))
    yield "deeply nested header", _with_header_text(data, json.dumps(header)[:-1] + ', "x": ' + "[" * 100_000
                                                    + "]" * 100_000 + "}")
    yield "header not UTF-8", _zip({**_members(data), "attnx.json": b"\xff\xfe{}"})
    # the model config: each field of the model and of its first layer deleted or retyped
    for key in header["model"]["config"]:
        yield f"no config.{key}", _with_header(data, lambda h, k=key: h["model"]["config"].pop(k))
        for value in RETYPED:
            yield f"config.{key}={value!r}", _with_header(
                data, lambda h, k=key, v=value: h["model"]["config"].update({k: v}))
    for key in ("class_name", "config"):
        for value in RETYPED:
            yield f"layers[0].{key}={value!r}", _with_header(
                data, lambda h, k=key, v=value: h["model"]["config"]["layers"][0].update({k: v}))
    # the .npy members, checksums recomputed
    embedding = np.zeros((12, 4), np.float32)
    for descr in FOREIGN_DTYPES:
        dtype = np.dtype(descr)
        blob = _npy((12, 4), np.lib.format.dtype_to_descr(dtype), data=b"\0" * (48 * dtype.itemsize))
        yield f"npy {dtype}", _with_member(data, 0, blob)
        yield f"npy {dtype}, header agrees", _with_member(data, 0, blob, header_dtype=dtype.name)
    for shape in ((2_000_000_000,), (12, 5), (200_000_000, 4), (12,)):
        blob = _npy(shape, "<f4", data=embedding.tobytes())
        yield f"npy shape {shape}", _with_member(data, 0, blob)
        yield f"npy shape {shape}, header agrees", _with_member(data, 0, blob, header_shape=list(shape))
    yield "npy truncated data", _with_member(data, 0, _npy((12, 4), "<f4", data=embedding.tobytes()[:-4]))
    yield "npy extra data", _with_member(data, 0, _npy((12, 4), "<f4", data=embedding.tobytes() + b"\0" * 4))
    yield "npy fortran order", _with_member(data, 0, _npy((12, 4), "<f4", fortran=True, data=embedding.tobytes()))
    yield "npy version 3", _with_member(data, 0, _npy((12, 4), "<f4", data=embedding.tobytes(), version=b"\x03\x00"))
    yield "npy version 9", _with_member(data, 0, _npy((12, 4), "<f4", data=embedding.tobytes(), version=b"\x09\x00"))
    yield "npy no magic", _with_member(data, 0, embedding.tobytes())
    yield "npy header garbage", _with_member(data, 0, b"\x93NUMPY\x01\x00\x10\x00{'descr': __import__\n")
    yield "npy empty", _with_member(data, 0, b"")
    # the zip: compressed or encrypted members, names, sizes, CRCs, truncation
    members = _members(data)
    for method in (zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        yield f"all members method {method}", _zip(members, method)
        yield f"one weight method {method}", _zip(members, {"weights/00000.npy": method})
    for name in ("../evil.npy", "/etc/evil", "weights/../../evil.npy", "weights/00000.npy/../x", "C:\\evil",
                 "weights/99999.npy", "attnx.json\0x", "extra.txt"):
        yield f"extra member {name!r}", _zip({**members, name: b"x"})
    yield "duplicate member", _zip(list(members.items()) + [("weights/00000.npy", b"\x93NUMPY")])
    for name in ("attnx.json", "weights/00000.npy"):
        size = len(members[name])
        for field, value in (("size", 2 ** 31), ("size", 0xFFFFFFFE), ("compressed", 2 ** 31), ("size", size + 1),
                             ("size", size - 1), ("crc", 0), ("method", 8), ("method", 99), ("flags", 1)):
            yield f"{name} {field}={value}", _patch_directory(data, name, field, value)
    for cut in (0, 1, 22, len(data) // 2, len(data) - 22, len(data) - 1):
        yield f"cut at {cut}", data[:cut]


# ----------------------------------------------------------------------------- the loop
def test_every_crafted_file_raises_value_error_quickly_without_allocating(valid, tmp_path):
    path = tmp_path / "crafted.attnx"
    variants = list(_variants(valid))
    assert len(variants) > 300
    wrong, slow, greedy, accepted = [], [], [], []
    tracemalloc.start()
    try:
        for label, blob in variants:
            path.write_bytes(blob)
            tracemalloc.reset_peak()
            start = time.perf_counter()
            try:
                attnx.load_model(path)
            except ValueError:
                pass
            except Exception as exc:  # noqa: BLE001 - collected and reported below
                wrong.append(f"{label}: {type(exc).__name__}: {exc}"[:200])
            else:
                accepted.append(label)
            if time.perf_counter() - start > 2.0:
                slow.append(label)
            if tracemalloc.get_traced_memory()[1] > 32 * 2 ** 20:
                greedy.append((label, tracemalloc.get_traced_memory()[1]))
    finally:
        tracemalloc.stop()
    print(f"{len(variants)} crafted files")
    assert not wrong, "\n".join(wrong)
    assert not slow and not greedy, (slow, greedy)
    # what may load: a field nothing reads (attnx_version, weight names: weights match by order), a value
    # the field may hold (no compile settings, no optimizer state, no input for a Sequential whose first
    # layer has an input_shape), and a model name, which the layer API takes as given
    harmless = ("no attnx_version", "attnx_version=", "no compile", "compile=None", "no optimizer_state",
                "optimizer_state=None", "optimizer_state.iterations=0", "compile.loss_weights=None",
                "compile.loss_weights=[5]", "weights[0].name='x'", "optimizer_weights[0].name='x'",
                "no config.input", "config.name=")
    assert not {a for a in accepted if not any(a.startswith(h) for h in harmless)}, "\n".join(accepted)


def test_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        attnx.load_model(tmp_path / "nope.attnx")


# ----------------------------------------------------------------------------- named defects
@pytest.mark.parametrize("header_agrees", [False, True], ids=["header float32", "header agrees"])
@pytest.mark.parametrize("descr", FOREIGN_DTYPES, ids=str)
def test_npy_member_of_a_foreign_dtype_is_a_value_error(valid, tmp_path, descr, header_agrees):
    dtype = np.dtype(descr)
    blob = _npy((12, 4), np.lib.format.dtype_to_descr(dtype), data=b"\0" * (48 * dtype.itemsize))
    path = tmp_path / "dtype.attnx"
    path.write_bytes(_with_member(valid, 0, blob, header_dtype=dtype.str if header_agrees else None))
    expected = (r"weights\[0\]\.dtype is .*; weights are bool, integer or floating point" if header_agrees
                else r"has shape \(12, 4\) .*, header says \[12, 4\] float32")
    with pytest.raises(ValueError, match=r"dtype\.attnx: .*" + expected):
        attnx.load_model(path)


def _changed(h, change):
    change(h)
    return h


@pytest.mark.parametrize("new_header, message", [
    (lambda h: [h], r"the header attnx\.json should be an object, got list"),
    (lambda h: {**h, "weights": 5}, r"header field 'weights' should be a list, got int 5"),
    (lambda h: _changed(h, lambda h: h["weights"][0].update(shape=[2e9])),
     r"weights\[0\]\.shape\[0\] should be an integer, got float"),
    (lambda h: _changed(h, lambda h: h["compile"].update(loss=[{"class_name": "Nope", "config": {}}])),
     "Unknown loss class 'Nope'"),
    (lambda h: _changed(h, lambda h: h["compile"]["optimizer"].update(class_name="Nope")),
     "compile settings .*KeyError: 'Nope'"),
    (lambda h: {**h, "model": []}, r"header field 'model' should be an object, got list"),
])
def test_malformed_header_names_what_was_expected(valid, tmp_path, new_header, message):
    path = tmp_path / "h.attnx"
    path.write_bytes(_with_header_text(valid, json.dumps(new_header(json.loads(_members(valid)["attnx.json"])))))
    with pytest.raises(ValueError, match=r"h\.attnx: .*" + message):
        attnx.load_model(path)


def test_deflated_member_is_refused_without_decompressing(valid, tmp_path):
    """A small file whose one member inflates to 256 MiB: refused from the directory alone."""
    members = _members(valid)
    del members["weights/00000.npy"]
    path = tmp_path / "bomb.attnx"
    with zipfile.ZipFile(path, "w") as zf:
        for name, blob in members.items():
            zf.writestr(name, blob)
        info = zipfile.ZipInfo("weights/00000.npy", (2024, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w") as member:  # streamed: the test never holds the inflated bytes either
            member.write(_npy((2 ** 26,), "<f4"))
            for _ in range(2 ** 28 // 2 ** 20):
                member.write(bytes(2 ** 20))
    assert path.stat().st_size < 2 * 2 ** 20
    with pytest.raises(ValueError, match=r"member 'weights/00000\.npy' is compressed \(zip method 8\); "
                                         "attnx files store their members uncompressed"):
        attnx.load_model(path)


def test_path_traversal_member_is_refused_and_never_extracted(valid, tmp_path):
    path = tmp_path / "dir" / "m.attnx"
    path.parent.mkdir()
    path.write_bytes(_zip({**_members(valid), "../evil.txt": b"owned"}))
    with pytest.raises(ValueError, match=r"unexpected member '\.\./evil\.txt'"):
        attnx.load_model(path)
    assert not (tmp_path / "evil.txt").exists()


# Loads a file in a fresh interpreter with a 2 GiB address-space limit (so that a regression fails
# with MemoryError instead of taking the machine) and prints the exception, the seconds and peak RSS.
# Under AddressSanitizer (scripts/sanitize.sh preloads it) there is no such limit: ASan reserves its
# shadow memory as address space; the peak RSS still tells.
_LOAD_IN_CHILD = textwrap.dedent("""
    import os, resource, sys, time
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    import attnx
    start = time.perf_counter()
    try:
        attnx.load_model(sys.argv[1])
        outcome = "loaded"
    except BaseException as exc:
        outcome = type(exc).__name__ + ": " + str(exc)[:300]
    seconds = time.perf_counter() - start
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork and exec (pytest's own peak), the
    # high-water mark belongs to this interpreter's address space alone
    peak_kib = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
    print(repr((outcome, seconds, peak_kib / 1024)))
""")


def _load_in_child(path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _LOAD_IN_CHILD, str(path)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - our own child's repr of a tuple


def _huge_embedding(h, entry_too):
    """The config's Embedding grows to 2e8 x 4 float32 (3 GiB), and its header entry too, or not."""
    h["model"]["config"]["layers"][0]["config"]["input_dim"] = 200_000_000
    if entry_too:
        h["weights"][0]["shape"] = [200_000_000, 4]


@pytest.fixture(scope="module")
def valid_load_peak_mib(valid, tmp_path_factory):
    """The peak RSS of a child that loads the valid file: the interpreter, NumPy and attnx (larger
    under ASan), against which a crafted file's load is measured."""
    path = tmp_path_factory.mktemp("valid_peak") / "model.attnx"
    path.write_bytes(valid)
    outcome, _, peak_mib = _load_in_child(path)
    assert outcome == "loaded", outcome
    return peak_mib


# Building the model from its config creates its weights: the weight budget load_model sets
# (Layer.add_weight refuses more bytes than the file's weights hold) stops a config that lies alone.
@pytest.mark.parametrize("case", ["npy shape (2e9,)", "header and npy shape (2e9,)", "Embedding(2e8)",
                                  "Embedding(2e8) in the config only"])
def test_huge_declared_sizes_raise_quickly_without_allocating(valid, valid_load_peak_mib, tmp_path, case):
    path = tmp_path / "huge.attnx"
    if case.startswith("Embedding"):
        entry_too = case == "Embedding(2e8)"
        path.write_bytes(_with_header(valid, lambda h: _huge_embedding(h, entry_too)))
        expected = (r"weight 'embedding.*' declares shape \[200000000, 4\] float32 \(3200000000 bytes\), "
                    r"its member holds \d+ bytes" if entry_too else
                    r"layer 'embedding.*' would create weight 'embeddings' of shape \(200000000, 4\)")
    else:
        blob = _npy((2_000_000_000,), "<f4", data=np.zeros((12, 4), np.float32).tobytes())
        agree = case.startswith("header")
        path.write_bytes(_with_member(valid, 0, blob, header_shape=[2_000_000_000] if agree else None))
        expected = (r"declares shape \[2000000000\] float32 \(8000000000 bytes\)" if agree
                    else r"has shape \(2000000000,\) float32, header says \[12, 4\]")
    assert path.stat().st_size < 16 * 1024
    outcome, seconds, peak_mib = _load_in_child(path)
    print(f"{case}: {outcome[:60]}... in {seconds * 1e3:.1f} ms, peak RSS {peak_mib:.0f} MiB")
    assert outcome.startswith("ValueError: ") and re.search(expected, outcome), outcome
    # the declared sizes are 3 and 8 GB: loading them would show as gigabytes above a valid file's load
    assert seconds < 1.0 and peak_mib < valid_load_peak_mib + 64
