"""Deploy a `Transformer` with CTranslate2: ``to_ctranslate2(model, directory)`` writes the folder that
``ctranslate2.Translator(directory)`` loads (its ``model.bin``, ``config.json`` and the vocabularies).

    attnx.export.to_ctranslate2(model, "mar-ct2", quantization="int8")
    translator = ctranslate2.Translator("mar-ct2", device="cpu")
    pieces = model.source_tokenizer.tokenize("I am hungry.")
    best = translator.translate_batch([pieces], beam_size=4)[0].hypotheses[0]
    text = model.target_tokenizer.decode([model.target_tokenizer.word_index[p] for p in best])

Which models: a pre-norm `attnx.seq2seq.Transformer` (``norm_first=True``): CTranslate2's pre-norm
Transformer (with a final norm after each stack) is exactly that model, weights and all, with sinusoidal
or learned positions, shared, separate or tied embeddings, relu or gelu. Refused with a ValueError
naming the reason: a post-norm Transformer (CTranslate2's post-norm layers have no final norm, attnx's and
PyTorch's have one), a model without its tokenizers (CTranslate2 translates pieces of a vocabulary), and
`Seq2Seq` (CTranslate2 has no recurrent encoder-decoder with additive attention: its specs are
transformers and language models).

Needs the ``ctranslate2`` package (``pip install ctranslate2``).
"""
import numpy as np

__all__ = ["to_ctranslate2"]

QUANTIZATIONS = (None, "float32", "int8", "int8_float32", "int16", "float16", "bfloat16", "int8_bfloat16")


def to_ctranslate2(model, directory, quantization=None, force=False):
    """Writes `model` (a pre-norm `Transformer` with its tokenizers) as a CTranslate2 model folder.

    Args:
        model: the `attnx.seq2seq.Transformer`.
        directory: the folder to create.
        quantization: the weights' type in the folder (CTranslate2's names: None keeps float32, ``"int8"``
            stores int8 weights with a float32 scale per output row).
        force: replace a folder that exists.

    Returns:
        The folder's path.
    """
    from ..translation import Transformer
    if not isinstance(model, Transformer):
        raise TypeError(f"to_ctranslate2: expected an attnx.seq2seq.Transformer, got {type(model).__name__} "
                        "(CTranslate2 runs transformer models only)")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"to_ctranslate2: quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    spec = ctranslate2_spec(model)
    from ctranslate2.converters.converter import Converter

    class _AttnxConverter(Converter):
        def _load(self):
            return spec
    return _AttnxConverter().convert(str(directory), quantization=quantization, force=force)


def ctranslate2_spec(model):
    """A `ctranslate2.specs.TransformerSpec` holding the weights of a pre-norm attnx Transformer."""
    try:
        from ctranslate2.specs import common_spec, transformer_spec
    except ImportError:
        raise ImportError("to_ctranslate2 needs the ctranslate2 package: pip install ctranslate2") from None
    if any(p.dtype == np.int8 for p in model.params.values()):  # int8 values read as floats would be garbage
        raise ValueError(f"to_ctranslate2: model '{model.name}' is quantized (int8); convert the float32 model "
                         "(before model.quantize), with quantization='int8' for CTranslate2's int8 weights")
    if not model.stack_config["norm_first"]:
        raise ValueError("to_ctranslate2: CTranslate2's post-norm Transformer has no final norm after its stacks, "
                         "attnx's (as PyTorch's) has one; convert a norm_first=True model")
    if model.source_tokenizer is None or model.target_tokenizer is None:
        raise ValueError("to_ctranslate2: the model has no tokenizers; CTranslate2 translates pieces of the "
                         "vocabularies (build the model with Transformer.from_texts or give source_tokenizer and "
                         "target_tokenizer)")
    activations = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    if model.stack_config["activation"] not in activations:
        raise ValueError(f"to_ctranslate2: CTranslate2 has no feed-forward activation "
                         f"{model.stack_config['activation']!r}; relu and gelu convert")
    spec = transformer_spec.TransformerSpec.from_config(
        (model.encoder.num_layers, model.decoder.num_layers), model.num_heads, pre_norm=True,
        activation=activations[model.stack_config["activation"]])
    D = model.model_dim
    # always a copy: CTranslate2's converter quantizes the spec's arrays in place
    f32 = (lambda a: np.array(a, dtype=np.float32, order="C", copy=True))

    def attention(spec_attention, layer, fused_qkv):
        p = layer.params
        q, k, v = (p[f"{n}_kernel"].reshape(D, -1).T for n in ("query", "key", "value"))
        qb, kb, vb = (p[f"{n}_bias"].reshape(-1) for n in ("query", "key", "value"))
        if fused_qkv:
            spec_attention.linear[0].weight = f32(np.concatenate([q, k, v]))
            spec_attention.linear[0].bias = f32(np.concatenate([qb, kb, vb]))
        else:
            spec_attention.linear[0].weight, spec_attention.linear[0].bias = f32(q), f32(qb)
            spec_attention.linear[1].weight = f32(np.concatenate([k, v]))
            spec_attention.linear[1].bias = f32(np.concatenate([kb, vb]))
        spec_attention.linear[-1].weight = f32(p["output_kernel"].reshape(-1, D).T)
        spec_attention.linear[-1].bias = f32(p["output_bias"])

    def norm(spec_norm, layer):
        spec_norm.gamma, spec_norm.beta = f32(layer.params["gamma"]), f32(layer.params["beta"])

    def feed_forward(spec_ffn, layer):
        for spec_linear, dense in ((spec_ffn.linear_0, layer.intermediate_dense),
                                   (spec_ffn.linear_1, layer.output_dense)):
            spec_linear.weight, spec_linear.bias = f32(dense.params["kernel"].T), f32(dense.params["bias"])

    longest = max(model.max_length + 2, 1024)  # CTranslate2's default max_input_length is 1024
    for side, stack, final, embedding, positions in (
            (spec.encoder, model.encoder, model.encoder_norm, model.source_embedding, model.source_positions),
            (spec.decoder, model.decoder, model.decoder_norm, model.target_embedding, model.target_positions)):
        (side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings).weight = \
            f32(embedding.params["embeddings"])
        side.scale_embeddings = True
        side.position_encodings.encodings = f32(positions.table(longest, D)[:longest]) \
            if model.positions == "sinusoidal" else f32(positions.params["embeddings"])
        norm(side.layer_norm, final)
        for spec_layer, block in zip(side.layer, stack.blocks):
            # CTranslate2's pre-norm layer: each sublayer's spec holds the norm before it
            targets = {"self_attention": spec_layer.self_attention, "feed_forward": spec_layer.ffn,
                       "cross_attention": getattr(spec_layer, "attention", None)}
            for kind, block_norm, sublayer in block.residual_blocks():
                norm(targets[kind].layer_norm, block_norm)
                if kind == "feed_forward":
                    feed_forward(targets[kind], sublayer)
                else:
                    attention(targets[kind], sublayer, fused_qkv=kind == "self_attention")
    if model.output_projection is None:  # tied to the target embeddings
        spec.decoder.projection.weight = f32(model.target_embedding.params["embeddings"])
        spec.decoder.projection.bias = np.zeros(model.target_vocab_size, np.float32)
    else:
        spec.decoder.projection.weight = f32(model.output_projection.params["kernel"].T)
        spec.decoder.projection.bias = f32(model.output_projection.params["bias"])
    spec.register_source_vocabulary(_vocabulary(model.source_tokenizer, model.source_vocab_size, "source"))
    spec.register_target_vocabulary(_vocabulary(model.target_tokenizer, model.target_vocab_size, "target"))
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = "<unk>", "<start>", "<end>"
    spec.config.decoder_start_token = "<start>"
    spec.config.layer_norm_epsilon = model.stack_config["layer_norm_epsilon"]
    return spec


def _vocabulary(tokenizer, size, side):
    """The pieces by id, id 0 (padding) as CTranslate2's ``<blank>``; ids the model has beyond the tokenizer's
    (a model built with a larger vocabulary) as placeholders nothing encodes to."""
    if tokenizer.vocab_size > size:
        raise ValueError(f"to_ctranslate2: the {side} tokenizer has {tokenizer.vocab_size} ids, the model's {side} "
                         f"vocabulary only {size}")
    return ["<blank>"] + [tokenizer.index_word.get(i, f"<unused{i}>") for i in range(1, size)]
