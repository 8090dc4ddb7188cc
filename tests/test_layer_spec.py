"""The public layer spec the cross-cutting features read (issue 38): quantization, ONNX export and
interop reach layers and models through public methods and properties only (`quantizable_weights`,
`quantize_refusal`, `cell_kind`, `directions`, `level_biases`, `window_shape`, `key_size`,
`Model.nodes`, ...), never through a private member of another object."""
import ast
from pathlib import Path

import numpy as np
import pytest

import attnx
from attnx import layers

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "attnx"
SPEC_READERS = sorted([PACKAGE / "quantization.py", *(PACKAGE / "export").glob("*.py"),
                       *(PACKAGE / "interop").glob("*.py")])


def private_reads(source):
    """(line, text) of every read of a private member of another object: `x._name` (x not self / cls),
    `getattr(x, "_name")`, and `from <another attnx package> import _name`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and str(name.value).startswith("_"):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.level > 1:  # from ..layers.x import _private
            found += [(node.lineno, f"from {'.' * node.level}{node.module} import {a.name}") for a in node.names
                      if a.name.startswith("_")]
    return found


@pytest.mark.parametrize("path", SPEC_READERS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_member_reads(path):
    found = private_reads(path.read_text())
    assert not found, f"{path.relative_to(PACKAGE)} reads private members: {found}"


def test_the_scan_finds_private_reads():
    source = ("def f(layer, self):\n    a = layer._cell\n    b = getattr(layer, '_kind', None)\n"
              "    c = self._fine\n    d = layer.__class__\nfrom ..layers.recurrent import _swap\n")
    assert sorted(line for line, _ in private_reads(source)) == [2, 3, 6]


def _built(layer, x):
    layer(x)
    return layer


def test_recurrent_spec(rng):
    x = rng.normal(size=(2, 5, 3)).astype(np.float32)
    for cls, kind in ((layers.SimpleRNN, "simple"), (layers.GRU, "gru"), (layers.LSTM, "lstm")):
        layer = _built(cls(4, num_layers=2), x)
        assert layer.cell_kind == kind and layer.input_dim == 3
        assert set(layer.quantizable_weights()) == {"kernel", "recurrent_kernel", "kernel_1", "recurrent_kernel_1"}
        b_in, b_rec = layer.level_biases(1)  # views of the weights, not copies
        assert np.shares_memory(b_in, layer.params["bias_1"]) and b_in.shape == (layer.params["kernel"].shape[1],)
        assert (b_rec is None) == (kind != "gru")
    bidirectional = _built(layers.Bidirectional(layers.GRU(4)), x)
    assert [(layer, reverse) for layer, reverse in bidirectional.directions] == \
        [(bidirectional.forward_layer, False), (bidirectional.backward_layer, True)]
    assert bidirectional.quantizable_weights() == {} and bidirectional.sublayers == [bidirectional.forward_layer,
                                                                                     bidirectional.backward_layer]
    lstmn = _built(layers.LSTMN(4), x)
    assert lstmn.quantizable_weights() == {} and "no int8 form" in lstmn.quantize_refusal()


def test_other_public_spec(rng):
    conv = _built(layers.Conv2D(2, (3, 2)), rng.normal(size=(1, 5, 5, 1)).astype(np.float32))
    pool = _built(layers.MaxPooling2D((2, 2)), rng.normal(size=(1, 4, 4, 1)).astype(np.float32))
    assert conv.window_shape == (3, 2) and pool.window_shape == (2, 2)
    q, k = rng.normal(size=(2, 3, 6)).astype(np.float32), rng.normal(size=(2, 4, 5)).astype(np.float32)
    attention = _built(layers.BahdanauAdditiveAttention(units=7, normalize=True), [q, k])
    assert (attention.query_size, attention.key_size) == (6, 5) and attention.score_vector().shape == (7,)
    assert layers.Dense(3).quantizable_weights() == {"kernel": "columns"}
    assert layers.Embedding(5, 3).quantizable_weights() == {"embeddings": "rows"}
    assert layers.LayerNormalization().quantizable_weights() == {}
    inp = attnx.Input((4,))
    dense = layers.Dense(2)
    model = attnx.Model(inp, dense(inp))
    assert [node.layer for node in model.nodes] == [dense] and model.sublayers == [dense]
