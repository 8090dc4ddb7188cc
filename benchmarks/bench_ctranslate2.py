"""attnx's `Transformer` against CTranslate2 on the same weights: translation tokens per second.

    pip install ctranslate2
    python benchmarks/bench_ctranslate2.py [--model PATH.attnx] [--sentences 512] [--threads 1 2]

Converts a pre-norm attnx `Transformer` (``norm_first=True``: CTranslate2's pre-norm layers with
a final norm are exactly that model; its post-norm layers have no final norm) to a
`ctranslate2.specs.TransformerSpec`, checks that both give the same greedy translations, then
times `translate_batch` on the Marathi test sentences for beam 1 and 4, batch 1 and 32, each
thread count, interleaved (attnx, then CTranslate2, per setting). Without --model, a model of the
size of examples/translate_mar_transformer.py with random weights (pre-norm) is used, the
translations cut at --max-length tokens.
"""
import argparse
import os
import tempfile
import time

import numpy as np

import attnx
from attnx.seq2seq import Transformer


def to_ctranslate2_spec(model):
    """A `ctranslate2.specs.TransformerSpec` holding the weights of a pre-norm attnx Transformer."""
    from ctranslate2.specs import common_spec, transformer_spec
    if not model.stack_config["norm_first"]:
        raise ValueError("to_ctranslate2_spec: CTranslate2's post-norm Transformer has no final norm; "
                         "convert a norm_first=True model")
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}[
        model.stack_config["activation"]]
    spec = transformer_spec.TransformerSpec.from_config(
        (model.encoder.num_layers, model.decoder.num_layers), model.num_heads, pre_norm=True, activation=activation)
    D = model.model_dim
    f32 = (lambda a: np.ascontiguousarray(a, dtype=np.float32))

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
        for spec_linear, dense in ((spec_ffn.linear_0, layer.intermediate_dense), (spec_ffn.linear_1, layer.output_dense)):
            spec_linear.weight, spec_linear.bias = f32(dense.params["kernel"].T), f32(dense.params["bias"])

    table = f32(model.source_positions.table(512, D)[:512]) if model.positions == "sinusoidal" else None
    for side, stack, final, embedding, positions in (
            (spec.encoder, model.encoder, model.encoder_norm, model.source_embedding, model.source_positions),
            (spec.decoder, model.decoder, model.decoder_norm, model.target_embedding, model.target_positions)):
        (side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings).weight = \
            f32(embedding.params["embeddings"])
        side.scale_embeddings = True
        side.position_encodings.encodings = table if table is not None else f32(positions.params["embeddings"])
        norm(side.layer_norm, final)
        for spec_layer, block in zip(side.layer, stack.blocks):
            attention(spec_layer.self_attention, block.self_attention, True)
            norm(spec_layer.self_attention.layer_norm, block.norm1)
            if side is spec.decoder:
                attention(spec_layer.attention, block.cross_attention, False)
                norm(spec_layer.attention.layer_norm, block.norm2)
                norm(spec_layer.ffn.layer_norm, block.norm3)
            else:
                norm(spec_layer.ffn.layer_norm, block.norm2)
            feed_forward(spec_layer.ffn, block.feed_forward)
    if model.output_projection is None:
        spec.decoder.projection.weight = f32(model.target_embedding.params["embeddings"])
        spec.decoder.projection.bias = np.zeros(model.target_vocab_size, np.float32)
    else:
        spec.decoder.projection.weight = f32(model.output_projection.params["kernel"].T)
        spec.decoder.projection.bias = f32(model.output_projection.params["bias"])
    vocab = (lambda tok, size: ["<blank>"] + [tok.index_word[i] for i in range(1, size)])
    spec.register_source_vocabulary(vocab(model.source_tokenizer, model.source_vocab_size))
    spec.register_target_vocabulary(vocab(model.target_tokenizer, model.target_vocab_size))
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = "<unk>", "<start>", "<end>"
    spec.config.decoder_start_token = "<start>"
    spec.config.layer_norm_epsilon = model.stack_config["layer_norm_epsilon"]
    return spec


def save_ctranslate2(model, output_dir, quantization="float32"):
    from ctranslate2.converters.converter import Converter

    class _AttnxConverter(Converter):
        def _load(self):
            return to_ctranslate2_spec(model)
    return _AttnxConverter().convert(output_dir, quantization=quantization, force=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a saved pre-norm attnx Transformer")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-length", type=int, default=20)
    args = parser.parse_args()
    import ctranslate2
    splits = attnx.datasets.load_anki_pairs(max_words=10, split=(0.8, 0.1, 0.1), seed=0)
    if args.model:
        model = attnx.load_model(args.model)
    else:
        attnx.set_random_seed(0)
        model = Transformer.from_texts(splits.train.source, splits.train.target, vocab_size=6000, model_dim=256,
                                       num_heads=4, intermediate_dim=512, num_encoder_layers=2, num_decoder_layers=2,
                                       norm_first=True, dropout=0.0)
    sentences = [" ".join(s.split()[1:-1]) for s in splits.test.source[:args.sentences]]
    pieces = [model.source_tokenizer.tokenize(s) for s in sentences]
    path = save_ctranslate2(model, os.path.join(tempfile.mkdtemp(), "ct2"))
    L = args.max_length
    print(f"{len(sentences)} sentences, max_length {L}; model {model.count_params():,} parameters")
    for threads in args.threads:
        attnx.set_num_threads(threads)
        translator = ctranslate2.Translator(path, device="cpu", inter_threads=1, intra_threads=threads)
        for width in (1, 4):
            for batch in (1, 32):
                start = time.perf_counter()
                ours = model.translate_batch(sentences, width=width, max_length=L, batch_size=batch)
                t_ours = time.perf_counter() - start
                start = time.perf_counter()
                theirs = translator.translate_batch(pieces, beam_size=width, max_batch_size=batch,
                                                    max_decoding_length=L, batch_type="examples")
                t_theirs = time.perf_counter() - start
                ours_tokens = [[model.target_tokenizer.index_word[i] for i in h.tokens] for h in ours]
                theirs_tokens = [r.hypotheses[0] for r in theirs]
                same = np.mean([a == b for a, b in zip(ours_tokens, theirs_tokens)])
                n_ours = sum(len(t) for t in ours_tokens)
                n_theirs = sum(len(t) for t in theirs_tokens)
                print(f"threads {threads} beam {width} batch {batch:2d}: attnx {n_ours / t_ours:8.0f} tokens/s, "
                      f"CTranslate2 float32 {n_theirs / t_theirs:8.0f} tokens/s, ratio "
                      f"{(n_ours / t_ours) / (n_theirs / t_theirs):.2f}; same translations {100 * same:.1f}%",
                      flush=True)


if __name__ == "__main__":
    main()
