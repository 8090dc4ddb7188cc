"""Marathi BLEU under int8 (issue 39): a translator (Transformer or Seq2Seq) against its own int8 copy.

    python benchmarks/int8_translation_bleu.py [--model PATH.attnx | --minutes 15] [--save PATH.attnx]

Without --model, trains a short English -> Marathi `Transformer` (pre-norm, D --dim, 2 + 2 layers,
shared SentencePiece BPE, attnx's recipe with a warm-up of --warmup-steps) for --minutes of wall time on
`load_anki_pairs(max_words=10, split=(0.8, 0.1, 0.1), seed=0, raw=True)` (--save keeps it, e.g. for
bench_ctranslate2_int8.py). Then quantizes a copy (``model.quantize("int8")``: embeddings, every
attention projection, feed-forward network and the output projection) and scores both on the test
split: cased sacreBLEU of the detokenized translations against the raw references
(`Transformer.evaluate_bleu`), greedy and beam 4 (length penalty 0.6), and the share of test
sentences whose int8 greedy translation is the float32 one word for word.
"""
import argparse
import os
import tempfile
import time

import attnx
from attnx import decoding
from attnx.seq2seq import Transformer


class StopAfter(attnx.callbacks.Callback):
    """Stops training after `seconds` of wall time."""

    def __init__(self, seconds):
        super().__init__()
        self.deadline = time.perf_counter() + seconds

    def on_train_batch_end(self, batch, logs=None):
        if time.perf_counter() > self.deadline:
            self.model.stop_training = True


def train(splits, minutes, dim, warmup_steps, seed):
    attnx.set_random_seed(seed)
    model = Transformer.from_texts(splits.train.source, splits.train.target, vocab_size=4000, model_dim=dim,
                                   num_heads=4, intermediate_dim=4 * dim, num_encoder_layers=2,
                                   num_decoder_layers=2, norm_first=True, dropout=0.1)
    model.compile(warmup_steps=warmup_steps)  # not "auto": the run's length is a time, not a number of epochs
    model.fit_texts(splits.train.source, splits.train.target, batch_size=64, epochs=1000, verbose=0,
                    callbacks=[StopAfter(60 * minutes)])
    return model


def greedy_tokens(model, sources, batch_size=64):
    """Each sentence's greedy translation as a list of target ids (a Transformer's or a Seq2Seq's)."""
    if isinstance(model, Transformer):
        return [list(h.tokens) for h in model.translate_batch(sources, return_attention=False)]
    tokens = []
    for lo in range(0, len(sources), batch_size):
        ids, _ = model.greedy_decode(model.encode_sources(sources[lo:lo + batch_size]))
        tokens += [decoding.until_end(row, model.end_id)[0] for row in ids.tolist()]
    return tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a saved attnx Transformer or Seq2Seq, e.g. from "
                        "translation_quality.py --save-dir (else a Transformer is trained)")
    parser.add_argument("--minutes", type=float, default=15.0, help="training wall time without --model")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--warmup-steps", type=int, default=400)
    parser.add_argument("--save", default=None, help="where to save the trained float32 model")
    parser.add_argument("--test-pairs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    splits = attnx.datasets.load_anki_pairs(max_words=10, split=(0.8, 0.1, 0.1), seed=0, raw=True)
    start = time.perf_counter()
    model = attnx.load_model(args.model) if args.model else train(splits, args.minutes, args.dim, args.warmup_steps, args.seed)
    if args.save:
        model.save(args.save)
    print(f"model: {model.count_params():,} parameters ({'loaded' if args.model else 'trained'} in "
          f"{time.perf_counter() - start:.0f} s)")
    path = os.path.join(tempfile.mkdtemp(), "float.attnx")
    model.save(path)
    quantized = attnx.load_model(path).quantize("int8")
    n = args.test_pairs or len(splits.test.source)
    sources, references = splits.test.source[:n], splits.test.target[:n]
    for width, alpha in ((1, 0.0), (4, 0.6)):
        scores = [m.evaluate_bleu(sources, references, width=width, length_penalty=alpha, scorer="sacrebleu")
                  for m in (model, quantized)]
        ours, theirs = (100 * float(score) for score in scores)  # BleuScore is in [0, 1], sacreBLEU's scale 0-100
        print(f"beam {width}: cased sacreBLEU float32 {ours:.2f}, int8 {theirs:.2f} "
              f"(int8 - float32 = {theirs - ours:+.2f}) on {n} test pairs")
    ours, theirs = (greedy_tokens(m, sources) for m in (model, quantized))
    same = sum(a == b for a, b in zip(ours, theirs)) / n
    print(f"greedy: int8 translation equal to float32's for {same:.1%} of {n} test sentences")
    print(f"signature: {scores[0].signature}")


if __name__ == "__main__":
    main()
