"""The layer-contract and mask-rule cases of the layers of issue 41 (TimeDistributed, Lambda,
BatchNormalization, Conv1D, GlobalMaxPooling1D, GlobalAveragePooling2D, Dot, Permute), in the format
of `test_layer_contract.CASES` / `MASKED`, which add them."""
from attnx import layers, ops
from layer_inputs import mask as _mask, sequence as _seq

F64 = "float64"


CASES = {
    "TimeDistributed": (lambda: layers.TimeDistributed(layers.Dense(3, activation="tanh", dtype=F64)),
                        lambda r, B, T: [(_seq(r, B, T), "x")]),
    "Lambda": (lambda: layers.Lambda(ops.tanh, dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    # training moves the moving statistics; the outputs read the batch's, so shared calls equal their twins
    "BatchNormalization": (lambda: layers.BatchNormalization(dtype=F64),
                           lambda r, B, T: [(_seq(r, B + 1, T), "x"), (_mask(r, B + 1, T), "mask")]),
    "Conv1D": (lambda: layers.Conv1D(3, 2, padding="causal", dilation_rate=2, activation="tanh", dtype=F64),
               lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "mask")]),
    "GlobalMaxPooling1D": (lambda: layers.GlobalMaxPooling1D(dtype=F64),
                           lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "mask")]),
    "GlobalAveragePooling2D": (lambda: layers.GlobalAveragePooling2D(dtype=F64),
                               lambda r, B, T: [(r.standard_normal((B, T, T + 1, 2)), "x")]),
    "Dot": (lambda: layers.Dot(axes=[2, 2], normalize=True, dtype=F64),
            lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "x")]),
    "Permute": (lambda: layers.Permute((2, 1), dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
}

MASKED = {
    "BatchNormalization": (lambda: layers.BatchNormalization(), lambda l, x, m: l(x, mask=m)),
    "Conv1D": (lambda: layers.Conv1D(2, 2, padding="same"), lambda l, x, m: l(x, mask=m)),
    "GlobalMaxPooling1D": (lambda: layers.GlobalMaxPooling1D(), lambda l, x, m: l(x, mask=m)),
    "TimeDistributed": (lambda: layers.TimeDistributed(layers.Dense(2)), lambda l, x, m: l(x, mask=m)),
    "Lambda": (lambda: layers.Lambda(lambda x, mask: x * ops.expand_dims(ops.cast(mask, "float32"), -1)),
               lambda l, x, m: l(x, mask=m)),
}
