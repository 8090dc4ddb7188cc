"""English -> Marathi translation with Bahdanau attention (the TensorFlow NMT tutorial's model) in attnx.

    python examples/translate_mar.py [--minutes 6] [--units 256] [--embedding-dim 128] [--data PATH]

Reads the Anki / manythings pairs (default $ATTNX_DATA_DIR/anki/mar.txt), keeps sentences of at
most 10 words, splits 80/10/10, trains for a fixed wall time, prints the test BLEU-4 (greedy
decoding) and one translation with its attention matrix (saved as a heatmap with --plot).
examples/translate_mar_torch.py trains the same architecture, from the same initial weights, in PyTorch.
"""
import argparse
import os
import time

import attnx
from attnx.seq2seq import Seq2Seq


def arguments(description):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--minutes", type=float, default=6.0, help="training wall time")
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--embedding-dim", type=int, default=128)
    parser.add_argument("--num-words", type=int, default=None, help="vocabulary size per language (rest: <unk>)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="path of mar.txt (default: $ATTNX_DATA_DIR)")
    parser.add_argument("--plot", default=None, help="save the attention heatmap of one translation here")
    return parser.parse_args()


class StopAfter(attnx.callbacks.Callback):
    """Stops training after the batch that crosses `seconds` of wall time (a fixed time budget
    rather than a number of epochs, to compare frameworks at equal time)."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_begin(self, logs=None):
        self.deadline = time.perf_counter() + self.seconds

    def on_train_batch_end(self, batch, logs=None):
        if time.perf_counter() > self.deadline:
            self.model.stop_training = True


def load_pairs(path=None, seed=0, raw=False, num_examples=None):
    """The English-Marathi pairs of at most 10 words, split 80/10/10 after a shuffle seeded by `seed`: the
    data of these examples and of the translation notebooks. `path`: mar.txt (default: the one in
    $ATTNX_DATA_DIR, else in ../shared/data); `raw`: the sentences as written rather than the tutorial's
    preprocessed text (the same pairs in the same splits); `num_examples`: only the shortest pairs."""
    data_dir = None if path or os.environ.get("ATTNX_DATA_DIR") else "../shared/data"
    return attnx.datasets.load_anki_pairs(path=path, data_dir=data_dir, max_words=10, num_examples=num_examples,
                                          split=(0.8, 0.1, 0.1), seed=seed, raw=raw)


def prepare(args):
    """The splits, and a freshly initialized attnx model with tokenizers fitted on the training split
    (the PyTorch example copies its weights, so both start from the same point)."""
    splits = load_pairs(args.data, args.seed)
    attnx.set_random_seed(args.seed)
    model = Seq2Seq.from_texts(splits.train.source, splits.train.target, num_words=args.num_words, oov_token="<unk>",
                               embedding_dim=args.embedding_dim, units=args.units, attention="bahdanau",
                               max_length=20)
    print(f"pairs: train {len(splits.train.source)}, val {len(splits.val.source)}, test {len(splits.test.source)}; "
          f"vocabulary: English {model.encoder.vocab_size}, Marathi {model.decoder.vocab_size}", flush=True)
    return splits, model


def main():
    args = arguments(__doc__.splitlines()[0])
    attnx.set_num_threads(args.threads)
    splits, model = prepare(args)
    model.compile(attnx.optimizers.Adam(args.learning_rate))
    source, target = model.encode_sources(splits.train.source), model.encode_targets(splits.train.target)
    start = time.perf_counter()
    history = model.fit(source, target, batch_size=args.batch_size, epochs=10 ** 6, verbose=2,
                        callbacks=[StopAfter(60 * args.minutes)])  # shuffled as seeded by prepare
    trained = time.perf_counter() - start
    bleu = model.evaluate_bleu(splits.test.source, splits.test.target)
    print(f"attnx: trained {trained:.0f} s, {len(history.epoch)} epochs; test BLEU-4 {100 * bleu:.2f}")
    sentence = splits.test.source[0]
    translation, attention = model.translate(sentence)
    print(f"{sentence} -> {translation}  (attention {attention.shape})")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        from attnx.plot import attention_heatmap
        ax = attention_heatmap(attention, sentence.split(), translation.split() + ["<end>"])
        ax.figure.savefig(args.plot, bbox_inches="tight")
    return bleu


if __name__ == "__main__":
    main()
