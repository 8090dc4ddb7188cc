"""English -> Marathi translation with the transformer of "Attention Is All You Need" in attnx.

    python examples/translate_mar_transformer.py [--minutes 15] [--model-dim 256] [--layers 3] [--data PATH]
        [--policy mixed_bfloat16]

The same pairs and split as examples/translate_mar.py (at most 10 words, 80/10/10, seed 0), but the
sentences as written (`load_anki_pairs(raw=True)`: cased, punctuation attached): a shared SentencePiece
BPE vocabulary learned on the training split, label smoothing 0.1, Adam on the Noam warm-up,
length-bucketed batches, a fixed wall time, the weights of the epoch with the best validation loss
kept. Prints the test BLEU-4 as papers report it (sacreBLEU, cased, on the detokenized translations
against the raw references, with its signature), greedy and beam 4. ``--policy mixed_bfloat16`` trains
with every product on bf16 operands (float32 weights, optimizer and loss; `attnx.mixed_precision`).
"""
import argparse
import os
import tempfile
import time

import attnx
from attnx import optimizers
from attnx.seq2seq import Transformer
from translate_mar import StopAfter, load_pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="training wall time")
    parser.add_argument("--model-dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--intermediate-dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    parser.add_argument("--vocab-size", type=int, default=6000, help="shared BPE vocabulary")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup-steps", type=int, default=1000)
    parser.add_argument("--lr-scale", type=float, default=1.0, help="scale of the Noam schedule")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="float32", choices=("float32", "mixed_bfloat16"),
                        help="the model's dtype policy")
    parser.add_argument("--data", default=None, help="path of mar.txt (default: $ATTNX_DATA_DIR)")
    args = parser.parse_args()
    attnx.set_num_threads(args.threads)
    splits = load_pairs(args.data, args.seed, raw=True)
    attnx.set_random_seed(args.seed)
    start = time.perf_counter()
    model = Transformer.from_texts(splits.train.source, splits.train.target, vocab_size=args.vocab_size,
                                   model_dim=args.model_dim, num_heads=args.heads,
                                   intermediate_dim=args.intermediate_dim, num_encoder_layers=args.layers,
                                   num_decoder_layers=args.layers, dropout=args.dropout, max_length=40,
                                   dtype=args.policy)
    print(f"pairs: train {len(splits.train.source)}, val {len(splits.val.source)}, test {len(splits.test.source)}; "
          f"shared SentencePiece BPE vocabulary {model.target_vocab_size} (learned in {time.perf_counter() - start:.0f} s); "
          f"{model.count_params():,} parameters, policy {args.policy}", flush=True)
    model.compile(optimizers.Adam(optimizers.NoamDecay(args.model_dim, args.warmup_steps, args.lr_scale),
                                  beta_2=0.98, epsilon=1e-9))
    best = os.path.join(tempfile.mkdtemp(), "best.attnx")
    start = time.perf_counter()
    history = model.fit_texts(splits.train.source, splits.train.target, batch_size=args.batch_size,
                              validation_data=(splits.val.source, splits.val.target), epochs=10 ** 6, verbose=2,
                              callbacks=[StopAfter(60 * args.minutes),
                                         attnx.callbacks.ModelCheckpoint(best, save_best_only=True)])
    trained = time.perf_counter() - start
    model = attnx.load_model(best)
    for width in (1, 4):
        start = time.perf_counter()
        bleu = model.evaluate_bleu(splits.test.source, splits.test.target, width=width, length_penalty=0.6,
                                   scorer="sacrebleu")
        print(f"attnx transformer: trained {trained:.0f} s, {len(history.epoch)} epochs (best val_loss "
              f"{min(history.history['val_loss']):.4f}); test width {width}: {bleu} "
              f"(decoded {len(splits.test.source)} sentences in {time.perf_counter() - start:.1f} s)", flush=True)
    for sentence in splits.test.source[:3]:
        print(f"{sentence} -> {model.translate(sentence, width=4)[0]}")


if __name__ == "__main__":
    main()
