"""`Seq2Seq` as two ONNX graphs and the greedy loop that runs them in ONNX Runtime.

- ``encoder.onnx``: ``source`` (batch, source_steps) int64 ids, 0 = padding ->
  ``encoder_outputs`` (batch, S, K), ``source_mask`` (batch, S) bool, the decoder's initial ``h``
  (and ``c`` for LSTM) and, unless the score is "dot", ``keys`` (the encoder outputs projected
  once for the score, as the decoder kernel does at its first step).
- ``decoder.onnx``: one decoder step. Inputs ``previous_ids`` (batch,) int64, ``h`` (``c``), for
  Luong ``feed`` (h~ of the previous step, zeros at the start), ``encoder_outputs``, ``keys``,
  ``source_mask``, and for local-m attention ``step`` (the target position, an int64 scalar);
  outputs ``logits`` (batch, V), ``new_h`` (``new_c``, ``new_feed``) and ``attention`` (batch, S),
  the step's attention weights.

`OnnxSeq2Seq` runs ``decoder.onnx`` as a decoder of `attnx.decoding`'s step protocol, so its greedy
decoding is `attnx.decoding.greedy_search`, the search `Seq2Seq.greedy_decode`'s fused loop equals:
the first step reads the start id, each next one the argmax of the previous logits (the first
maximum); a row that has produced the end id leaves the batch (0 tokens and zero attention from
then on), and the loop stops when every row has ended or after max_length steps. The model's start / end ids, max_length and tokenizers
travel in the decoder's metadata, so `OnnxSeq2Seq` needs only the folder::

    attnx.export.to_onnx(model, "mar_onnx")
    translator = attnx.export.OnnxSeq2Seq("mar_onnx")
    words, attention = translator.translate("<start> i am hungry . <end>")   # == model.translate(...)
"""
from pathlib import Path

import numpy as np

from .. import decoding, text
from ..layers.recurrent import Bidirectional
from ..seq2seq import LuongDecoder
from .attention import local_window, source_lengths
from .graph import OPSET, Graph, write
from .recurrent import cell_weights, one_step, run_stack

ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"
_INT64 = np.int64


def _encoder_graph(model):
    encoder, decoder = model.encoder, model.decoder
    g = Graph(f"{model.name}_encoder")
    source = g.add_input("source", _INT64, ["batch", "source_steps"])
    mask = g.node("Not", [g.node("Equal", [source, g.weight(np.asarray(0, _INT64), "zero")])])
    x = g.node("Gather", [g.weight(encoder.embedding.params["embeddings"], "encoder/embeddings"), source], axis=0)
    rnn = encoder.rnn
    directions = rnn.directions if isinstance(rnn, Bidirectional) else [(rnn, False)]
    tops, finals = run_stack(g, directions, x, mask)
    outputs = g.concat(tops, -1)
    states = [g.concat([hs[-1] for hs, _ in finals], -1)]
    if encoder.n_states == 2:
        states.append(g.concat([cs[-1] for _, cs in finals], -1))
    K, H = encoder.output_dim, decoder.units
    g.add_output(outputs, "encoder_outputs", np.float32, ["batch", "source_steps", K])
    g.add_output(mask, "source_mask", np.bool_, ["batch", "source_steps"])
    for name, state in zip(("h", "c"), states):
        g.add_output(state, name, np.float32, ["batch", H])
    if decoder.score_function.decoder_kind != "dot":  # the keys the kernel projects at its first step
        keys = g.matmul(outputs, decoder.params["key_kernel"], hint="decoder/key")
        g.add_output(keys, "keys", np.float32, ["batch", "source_steps", decoder.params["key_kernel"].shape[1]])
    return g


def _attend(g, decoder, query, encoder_outputs, keys, source_mask, step):
    """(context (B, K), weights (B, S)) of one step's query (B, H), as the decoder kernel attends;
    `step` is the target position (a scalar tensor) for local-m attention."""
    params = decoder.params
    scores = decoder.score_function.decoder_onnx(g, params, query, keys or encoder_outputs)
    if decoder.local_window is None:
        weights = g.masked_softmax(scores, source_mask)
        mixture = weights
    else:  # the softmax over the window; the context reads it times the Gaussian, the weights are without
        if decoder.local_mode == "m":  # p_t = t, clipped to the padded source
            last = g.node("Sub", [g.cast(g.shape_dim(encoder_outputs, 1), np.float32), g.scalar(1.0)])
            positions = g.reshape(g.node("Min", [g.cast(step, np.float32), last]), (1, 1))
        else:  # p_t = L sigmoid(v_p . tanh(h_t W_p)), L the row's real source length
            hidden = g.node("Tanh", [g.matmul(query, params["position_kernel"], hint="decoder/position")])
            gate = g.node("Sigmoid", [g.node("MatMul", [hidden, g.weight(params["position_vector"],
                                                                         "decoder/position_vector")])])
            positions = g.unsqueeze(g.node("Mul", [source_lengths(g, source_mask, encoder_outputs), gate]), 1)
        allowed, gauss = local_window(g, positions, decoder.local_window, source_mask, encoder_outputs)
        aligned = g.masked_softmax(g.unsqueeze(scores, 1), allowed)
        weights = g.squeeze(aligned, 1)
        mixture = g.squeeze(g.node("Mul", [aligned, gauss]), 1)
    context = g.squeeze(g.node("MatMul", [g.unsqueeze(mixture, 1), encoder_outputs]), 1)
    return context, weights


def _cell_step(g, decoder, x, states):
    """The decoder's RNN cell (default activations, GRU reset-after) on x (B, E + F) from [h(, c)]."""
    params = decoder.params
    weights = cell_weights(decoder.cell, decoder.units, params["kernel"], params["recurrent_kernel"], params["bias"])
    attributes = {"linear_before_reset": 1} if decoder.cell == "gru" else {}
    return one_step(g, decoder.cell, weights, x, states, "decoder", hidden_size=decoder.units, **attributes)


def _decoder_graph(model):
    decoder = model.decoder
    H, K = decoder.units, model.encoder.output_dim
    g = Graph(f"{model.name}_decoder")
    previous = g.add_input("previous_ids", _INT64, ["batch"])
    states = [g.add_input(name, np.float32, ["batch", H]) for name in ("h", "c")[:decoder.n_states]]
    luong = isinstance(decoder, LuongDecoder)
    feed = g.add_input("feed", np.float32, ["batch", H]) if luong else None
    encoder_outputs = g.add_input("encoder_outputs", np.float32, ["batch", "source_steps", K])
    keys = None
    if decoder.score_function.decoder_kind != "dot":
        keys = g.add_input("keys", np.float32, ["batch", "source_steps", decoder.params["key_kernel"].shape[1]])
    source_mask = g.add_input("source_mask", np.bool_, ["batch", "source_steps"])
    local_m = decoder.local_window is not None and decoder.local_mode == "m"
    step = g.add_input("step", _INT64, []) if local_m else None
    embedded = g.node("Gather", [g.weight(decoder.params["embeddings"], "decoder/embeddings"), previous], axis=0)
    if luong:  # h_t = RNN([emb; h~_{t-1}], h_{t-1}), a_t from h_t, h~_t = tanh([c_t; h_t] W_c)
        new_states = _cell_step(g, decoder, g.concat([embedded, feed], -1), states)
        context, weights = _attend(g, decoder, new_states[0], encoder_outputs, keys, source_mask, step)
        out = g.node("Tanh", [g.matmul(g.concat([context, new_states[0]], -1), decoder.params["attentional_kernel"],
                                       hint="decoder/attentional")])
    else:  # a_t from s_{t-1}, s_t = RNN([emb; c_t], s_{t-1})
        context, weights = _attend(g, decoder, states[0], encoder_outputs, keys, source_mask, step)
        new_states = _cell_step(g, decoder, g.concat([embedded, context], -1), states)
        out = new_states[0]
    logits = g.matmul(out, decoder.params["output_kernel"], decoder.params["output_bias"], "decoder/output")
    g.add_output(logits, "logits", np.float32, ["batch", decoder.vocab_size])
    for name, state in zip(("new_h", "new_c"), new_states):
        g.add_output(state, name, np.float32, ["batch", H])
    if luong:
        g.add_output(out, "new_feed", np.float32, ["batch", H])
    g.add_output(weights, "attention", np.float32, ["batch", "source_steps"])
    return g


def seq2seq_to_onnx(model, folder, opset=OPSET):
    """Writes `model` (a Seq2Seq) as ``encoder.onnx`` and ``decoder.onnx`` in `folder` (created if
    missing; its parent must exist). Returns the folder."""
    folder = Path(folder)
    if not folder.parent.is_dir():
        raise FileNotFoundError(f"attnx.export: cannot write into {str(folder)!r}: the folder "
                                f"{str(folder.parent)!r} does not exist")
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"attnx.export: a Seq2Seq is written into a folder, and {str(folder)!r} is a file")
    metadata = {"start_id": str(model.start_id), "end_id": str(model.end_id), "max_length": str(model.max_length)}
    for side, tokenizer in (("source", model.source_tokenizer), ("target", model.target_tokenizer)):
        if tokenizer is not None:
            metadata[f"{side}_tokenizer"] = tokenizer.to_json()
    encoder = _encoder_graph(model).model(opset, doc=f"attnx Seq2Seq '{model.name}': encoder")
    decoder = _decoder_graph(model).model(opset, doc=f"attnx Seq2Seq '{model.name}': one greedy decoder step",
                                          metadata=metadata)
    folder.mkdir(exist_ok=True)
    write(encoder, folder / ENCODER_FILE)
    write(decoder, folder / DECODER_FILE)
    return folder


class OnnxDecoderState:
    """The state inputs of ``decoder.onnx`` for N rows (input name -> array): the encoder's outputs
    (encoder_outputs, source_mask, keys) and the recurrent state (h, c, feed)."""

    def __init__(self, values):
        self.values = values

    def select(self, rows):
        """The state of the given rows (an index or bool array), in that order."""
        return OnnxDecoderState({name: value[rows] for name, value in self.values.items()})


class OnnxSeq2Seq:
    """A Seq2Seq exported by `attnx.export.to_onnx`, decoded greedily in ONNX Runtime.

    Args:
        folder: the folder `to_onnx` wrote (``encoder.onnx``, ``decoder.onnx``).
        providers: ONNX Runtime execution providers (default: the CPU).
        sess_options: an ``onnxruntime.SessionOptions`` (threads, ...), or None.
    """

    def __init__(self, folder, providers=("CPUExecutionProvider",), sess_options=None):
        import onnxruntime
        folder = Path(folder)
        for name in (ENCODER_FILE, DECODER_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"OnnxSeq2Seq: {str(folder / name)!r} not found (write it with "
                                        "attnx.export.to_onnx(seq2seq_model, folder))")
        self.encoder = onnxruntime.InferenceSession(str(folder / ENCODER_FILE), sess_options, providers=list(providers))
        self.decoder = onnxruntime.InferenceSession(str(folder / DECODER_FILE), sess_options, providers=list(providers))
        metadata = self.decoder.get_modelmeta().custom_metadata_map
        self.start_id, self.end_id = int(metadata["start_id"]), int(metadata["end_id"])
        self.max_length = int(metadata["max_length"])
        self.source_tokenizer, self.target_tokenizer = (
            text.tokenizer_from_json(metadata[key]) if key in metadata else None
            for key in ("source_tokenizer", "target_tokenizer"))
        self._decoder_inputs = [i.name for i in self.decoder.get_inputs()]
        self._decoder_outputs = [o.name for o in self.decoder.get_outputs()]

    def start_state(self, source):
        """The decoding state of source ids (B, S): ``encoder.onnx``'s outputs and a zero feed."""
        encoded = dict(zip((o.name for o in self.encoder.get_outputs()), self.encoder.run(None, {"source": source})))
        if "feed" in self._decoder_inputs:
            encoded["feed"] = np.zeros_like(encoded["h"])
        return OnnxDecoderState(encoded)

    def step(self, ids, position, state, return_attention=False):
        """One ``decoder.onnx`` step for N rows: the step protocol of `attnx.decoding`."""
        values = {**state.values, "previous_ids": ids, "step": np.asarray(position, dtype=np.int64)}
        outputs = dict(zip(self._decoder_outputs,
                           self.decoder.run(None, {name: values[name] for name in self._decoder_inputs})))
        following = dict(state.values)
        for name in ("h", "c", "feed"):
            if "new_" + name in outputs:
                following[name] = outputs["new_" + name]
        return outputs["logits"], OnnxDecoderState(following), (outputs["attention"] if return_attention else None)

    def greedy_decode(self, source, max_length=None):
        """Greedy translations of source ids (B, S) (0 = padding), as `Seq2Seq.greedy_decode`.

        Returns:
            (tokens (B, L) int64, 0 after each row's end token; attention (B, L, S)), L <= max_length.
        """
        source = np.asarray(source, dtype=np.int64)
        L = self.max_length if max_length is None else decoding.positive_int("OnnxSeq2Seq", "max_length", max_length)
        tokens, _, attention = decoding.greedy_search(self, self.start_state(source), len(source), self.start_id,
                                                      self.end_id, L)
        return tokens, attention

    def translate(self, sentence, max_length=None):
        """Greedy translation of one preprocessed sentence, as ``Seq2Seq.translate(sentence)``:
        (the translation without start / end tokens, attention (target words + 1, source tokens))."""
        if self.source_tokenizer is None or self.target_tokenizer is None:
            raise RuntimeError("OnnxSeq2Seq.translate: the exported model has no tokenizers; use greedy_decode on ids")
        source_tokenizer = self.source_tokenizer
        words = text.text_to_word_sequence(sentence, source_tokenizer.filters, source_tokenizer.lower,
                                           source_tokenizer.split)
        index, limit = source_tokenizer.word_index, source_tokenizer.num_words
        unknown = [w for w in words if w not in index or (limit and index[w] >= limit)]
        if not words or (unknown and source_tokenizer.oov_token is None):  # as Seq2Seq.encode_sources
            raise ValueError(f"OnnxSeq2Seq.translate: empty sentence or unknown source word(s) {unknown} in "
                             f"{sentence!r}")
        ids = source_tokenizer.texts_to_sequences([words])[0]
        tokens, attention = self.greedy_decode(np.asarray([ids], dtype=np.int64), max_length)
        words, steps = decoding.until_end(tokens[0].tolist(), self.end_id)
        weights = attention[0, :steps]
        index_word = self.target_tokenizer.index_word
        return " ".join(index_word.get(int(t), "<unk>") for t in words), weights


def onnx_greedy_translate(folder, sentence, max_length=None):
    """Translates one preprocessed sentence with the Seq2Seq exported to `folder` (see `OnnxSeq2Seq`)."""
    return OnnxSeq2Seq(folder).translate(sentence, max_length)

