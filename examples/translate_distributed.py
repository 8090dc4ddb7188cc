"""English -> Marathi translation with Bahdanau attention, data-parallel over MPI ranks.

    mpiexec -n 2 python examples/translate_distributed.py --threads 1        # 2 ranks on one machine
    mpiexec -f hosts -n 8 python examples/translate_distributed.py           # ranks on the hosts listed in `hosts`
    python examples/translate_distributed.py --threads 2                     # one process, for comparison

Every rank reads the same pairs (default $ATTNX_DATA_DIR/anki/mar.txt) and builds the same model;
`fit` gives each rank its shard of every global batch of --batch-size and sums the gradients
(attnx.distributed.DataParallel). Rank 0 prints the epoch times, the time spent in the allreduce
per step, the validation loss and the test BLEU-4.
"""
import argparse
import os
import time

import attnx
from attnx.seq2seq import Seq2Seq


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--embedding-dim", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch, split across the ranks")
    parser.add_argument("--threads", type=int, default=1, help="attnx threads per rank")
    parser.add_argument("--examples", type=int, default=10000, help="pairs kept (the shortest)")
    parser.add_argument("--data", default=None, help="path of mar.txt (default: $ATTNX_DATA_DIR)")
    args = parser.parse_args()

    strategy = attnx.distributed.DataParallel()
    attnx.set_num_threads(args.threads)
    path = args.data or os.path.join(os.environ.get("ATTNX_DATA_DIR", "../shared/data"), "anki", "mar.txt")
    splits = attnx.datasets.load_anki_pairs(path=path, max_words=10, num_examples=args.examples,
                                            split=(0.8, 0.1, 0.1), seed=0)
    attnx.set_random_seed(0)
    model = Seq2Seq.from_texts(splits.train.source, splits.train.target, oov_token="<unk>", embedding_dim=args.embedding_dim,
                               units=args.units, attention="bahdanau", max_length=20)
    model.compile("adam", distribute=strategy)
    source, target = model.encode_sources(splits.train.source), model.encode_targets(splits.train.target)
    val = (model.encode_sources(splits.val.source), model.encode_targets(splits.val.target))

    class EpochTimer(attnx.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start, self.reduce_start = time.perf_counter(), strategy.allreduce_seconds

        def on_epoch_end(self, epoch, logs=None):
            if strategy.is_main:
                seconds = time.perf_counter() - self.start
                reduce = (strategy.allreduce_seconds - self.reduce_start) / max(self.params["steps"], 1) * 1e3
                print(f"epoch {epoch + 1}: {seconds:.1f} s, allreduce {reduce:.2f} ms per step, "
                      f"loss {logs['loss']:.3f}, val_loss {logs['val_loss']:.3f} "
                      f"({strategy.size} rank(s) x {args.threads} thread(s))", flush=True)

    model.fit(source, target, batch_size=args.batch_size, epochs=args.epochs, validation_data=val,
              callbacks=[EpochTimer()], verbose=0)
    bleu = model.evaluate_bleu(splits.test.source[:500], splits.test.target[:500])
    if strategy.is_main:
        print(f"test BLEU-4 (greedy, 500 sentences): {bleu:.2f}")


if __name__ == "__main__":
    main()
