"""ONNX export: run attnx models in ONNX Runtime (or any ONNX runtime) with standard operators only.

    attnx.export.to_onnx(model, "sentiment.onnx")
    session = onnxruntime.InferenceSession("sentiment.onnx")
    probabilities = session.run(None, {session.get_inputs()[0].name: ids.astype("int64")})[0]
    probabilities = attnx.export.OnnxModel("sentiment.onnx").predict(ids)   # ids of any integer dtype

Sequential and functional models built from attnx's layers export as one graph (see
`SUPPORTED_LAYERS`); a `Seq2Seq` exports as an encoder graph and a one-step decoder graph that
also outputs the attention weights, with `OnnxSeq2Seq` running the greedy loop on them. The batch
axis is dynamic, and so is every axis the model's inputs leave open (``attnx.Input((None,))``).
Masks behave as in attnx: an ``Embedding(mask_zero=True)`` masks the padding for the layers after
it, in the graph. A layer without a converter (a layer written as ``call`` with attnx.ops) or with
an option export cannot express (HardAttention sampling its positions, a mask given as lengths)
raises `UnsupportedLayerError` naming it.

Needs the ``onnx`` package (``pip install "attnx[onnx]"``, which also brings onnxruntime).
"""
from ..models import Model
from ..seq2seq import Seq2Seq
from .graph import OPSET, UnsupportedLayerError  # first: it says so when onnx is missing
from . import attention, conv, core, keras_layers, recurrent, transformer  # noqa: F401  (register the converters)
from .model import OnnxModel, check_path, export_model
from .registry import supported_layers
from .seq2seq import OnnxSeq2Seq, onnx_greedy_translate, seq2seq_to_onnx
from .ctranslate2 import to_ctranslate2

__all__ = ["to_onnx", "to_ctranslate2", "OnnxModel", "OnnxSeq2Seq", "onnx_greedy_translate", "UnsupportedLayerError", "SUPPORTED_LAYERS", "OPSET"]

SUPPORTED_LAYERS = supported_layers()


def to_onnx(model, path, opset=OPSET, dynamic_steps=False):
    """Writes `model` as ONNX.

    Args:
        model: a built `Sequential` or functional `Model` made of the layers in `SUPPORTED_LAYERS`
            (nested models included), or a `Seq2Seq`.
        path: the ``.onnx`` file to write; for a Seq2Seq, a folder (created if missing) that gets
            ``encoder.onnx`` and ``decoder.onnx`` (read by `OnnxSeq2Seq`).
        opset: the ONNX opset of the graph (default `OPSET`; 18 or later).
        dynamic_steps: also leave axis 1 of every input open (the steps), for a model built with a
            fixed length (a Sequential's ``input_shape=(32,)``) that should take any length; the
            batch axis and the axes the inputs leave open (``attnx.Input((None,))``) always are.

    Returns:
        The path written (for a Seq2Seq, the folder).

    Raises:
        UnsupportedLayerError: a layer (or a layer option) has no ONNX form; the message names it.
        ValueError: the model is not built.
        FileNotFoundError: the folder of `path` does not exist.
        MemoryError: the export did not fit in the memory the process may use (no partial file is
            left). Weights of `graph.EXTERNAL_DATA_BYTES` (64 MiB) or more are streamed to
            ``<path>.data`` (ONNX external data) as they are converted: an export needs about half
            the model's weights again, plus 200 MiB.
    """
    if getattr(model, "quantization_mode", None):
        raise UnsupportedLayerError(f"attnx.export: model '{model.name}' is quantized ({model.quantization_mode}); "
                                    "export the float32 model (before model.quantize)")
    if isinstance(model, Seq2Seq):
        return seq2seq_to_onnx(model, path, opset)
    if not isinstance(model, Model):
        raise TypeError(f"attnx.export.to_onnx: expected an attnx Model, Sequential or Seq2Seq, got "
                        f"{type(model).__name__}")
    path = check_path(path)
    export_model(model, path, opset, dynamic_steps)
    return path
