"""attnx's int8 `Transformer` against CTranslate2 int8 on the same weights: translation tokens per second.

    pip install ctranslate2
    python benchmarks/bench_ctranslate2_int8.py [--model PATH.attnx] [--sentences 512] [--threads 1]

The float32 model (a pre-norm attnx `Transformer`, ``norm_first=True``; without --model one of the
size of bench_ctranslate2.py with random weights, translations cut at --max-length) is written with
`attnx.export.to_ctranslate2(..., quantization="int8")` and loaded with ``compute_type="int8"``; a
copy is quantized with ``model.quantize("int8")``. Both quantize the same float weights per output
row (symmetric, max|w| / 127); CTranslate2 quantizes its inputs per row too. Then `translate_batch`
on the Marathi test sentences for beam 1 and 4, batch 1 and 32, interleaved (attnx, then
CTranslate2, per setting), neither keeping the attention; printed: tokens/s of each, their ratio,
and the share of sentences whose translation is the same in both (and, for attnx int8, the same
as attnx float32's).
"""
import argparse
import os
import tempfile
import time

import numpy as np

import attnx
from attnx.export.ctranslate2 import to_ctranslate2
from bench_ctranslate2 import model_and_sentences


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a saved pre-norm attnx Transformer (float32)")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--max-length", type=int, default=20)
    args = parser.parse_args()
    import ctranslate2
    model, sentences = model_and_sentences(args)
    folder = tempfile.mkdtemp()
    path = to_ctranslate2(model, os.path.join(folder, "ct2"), quantization="int8")
    model.save(os.path.join(folder, "float.attnx"))
    quantized = attnx.load_model(os.path.join(folder, "float.attnx")).quantize("int8")
    pieces = [model.source_tokenizer.tokenize(s) for s in sentences]
    L = args.max_length
    print(f"{len(sentences)} sentences, max_length {L}; model {model.count_params():,} parameters; "
          f"attnx int8 tiles: {attnx._core.int8_level()}")
    for threads in args.threads:
        attnx.set_num_threads(threads)
        translator = ctranslate2.Translator(path, device="cpu", compute_type="int8", inter_threads=1,
                                            intra_threads=threads)
        for width in (1, 4):
            for batch in (1, 32):
                start = time.perf_counter()
                ours = quantized.translate_batch(sentences, width=width, max_length=L, batch_size=batch,
                                                 return_attention=False)
                t_ours = time.perf_counter() - start
                start = time.perf_counter()
                theirs = translator.translate_batch(pieces, beam_size=width, max_batch_size=batch,
                                                    max_decoding_length=L, batch_type="examples",
                                                    length_penalty=0.0)  # attnx's default search
                t_theirs = time.perf_counter() - start
                floats = model.translate_batch(sentences, width=width, max_length=L, batch_size=32,
                                               return_attention=False)
                ours_tokens = [[model.target_tokenizer.index_word[i] for i in h.tokens] for h in ours]
                theirs_tokens = [r.hypotheses[0] for r in theirs]
                same = np.mean([a == b for a, b in zip(ours_tokens, theirs_tokens)])
                same_float = np.mean([list(a.tokens) == list(b.tokens) for a, b in zip(ours, floats)])
                n_ours = sum(len(t) for t in ours_tokens)
                n_theirs = sum(len(t) for t in theirs_tokens)
                print(f"threads {threads} beam {width} batch {batch:2d}: attnx int8 {n_ours / t_ours:8.0f} tokens/s, "
                      f"CTranslate2 int8 {n_theirs / t_theirs:8.0f} tokens/s, ratio "
                      f"{(n_ours / t_ours) / (n_theirs / t_theirs):.2f}; same translations as CTranslate2 int8 "
                      f"{100 * same:.1f}%, as attnx float32 {100 * same_float:.1f}%", flush=True)


if __name__ == "__main__":
    main()
