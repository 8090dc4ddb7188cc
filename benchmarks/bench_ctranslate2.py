"""attnx's `Transformer` against CTranslate2 on the same weights: translation tokens per second.

    pip install ctranslate2
    python benchmarks/bench_ctranslate2.py [--model PATH.attnx] [--sentences 512] [--threads 1 2]
    python benchmarks/bench_ctranslate2.py --trees before=/tmp/old/python after=python   # interleaved

Converts a pre-norm attnx `Transformer` (``norm_first=True``) with `attnx.export.to_ctranslate2`, checks that both give the same greedy translations, then
times `translate_batch` on the Marathi test sentences for beam 1 and 4, batch 1 and 32, each
thread count, interleaved (attnx, then CTranslate2, per setting); neither keeps the attention
(CTranslate2's default, attnx's ``return_attention=False``). Without --model, a model of the
size of examples/translate_mar_transformer.py with random weights (pre-norm) is used, the
translations cut at --max-length tokens. With --trees, each checkout of attnx runs the whole
benchmark in its own process, one after the other (before / after a change, in one run).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import attnx
from attnx.export.ctranslate2 import to_ctranslate2
from attnx.seq2seq import Transformer


def model_and_sentences(args):
    """The benchmarked Transformer (`args.model`, else one of the example's size trained 0 steps on the
    Marathi pairs' tokenizer) and `args.sentences` test sentences without the loader's markers."""
    splits = attnx.datasets.load_anki_pairs(max_words=10, split=(0.8, 0.1, 0.1), seed=0)
    if args.model:
        model = attnx.load_model(args.model)
    else:
        attnx.set_random_seed(0)
        model = Transformer.from_texts(splits.train.source, splits.train.target, vocab_size=6000, model_dim=256,
                                       num_heads=4, intermediate_dim=512, num_encoder_layers=2, num_decoder_layers=2,
                                       norm_first=True, dropout=0.0)
    return model, [" ".join(s.split()[1:-1]) for s in splits.test.source[:args.sentences]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a saved pre-norm attnx Transformer")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-length", type=int, default=20)
    parser.add_argument("--trees", nargs="+", default=None, help="name=PYTHONPATH of each attnx to time")
    args = parser.parse_args()
    if args.trees:
        options = [a for a in sys.argv[1:] if a != "--trees" and a not in args.trees]
        for name, path in (t.split("=", 1) for t in args.trees):
            print(f"--- {name} ({path})", flush=True)
            subprocess.run([sys.executable, __file__, *options], env={**os.environ, "PYTHONPATH": os.path.abspath(path)},
                           check=True)
        return
    import ctranslate2
    model, sentences = model_and_sentences(args)
    pieces = [model.source_tokenizer.tokenize(s) for s in sentences]
    path = to_ctranslate2(model, os.path.join(tempfile.mkdtemp(), "ct2"))
    L = args.max_length
    print(f"{len(sentences)} sentences, max_length {L}; model {model.count_params():,} parameters")
    for threads in args.threads:
        attnx.set_num_threads(threads)
        translator = ctranslate2.Translator(path, device="cpu", inter_threads=1, intra_threads=threads)
        for width in (1, 4):
            for batch in (1, 32):
                start = time.perf_counter()
                ours = model.translate_batch(sentences, width=width, max_length=L, batch_size=batch,
                                               return_attention=False)  # as CTranslate2 by default
                t_ours = time.perf_counter() - start
                start = time.perf_counter()
                theirs = translator.translate_batch(pieces, beam_size=width, max_batch_size=batch,
                                                    max_decoding_length=L, batch_type="examples",
                                                    length_penalty=0.0)  # attnx's default search
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
