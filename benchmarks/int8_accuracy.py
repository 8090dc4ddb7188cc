"""The main job's sentiment model (examples/sentiment.py, scripts/main.sh's protocol) trained in
float32, then quantized with model.quantize("int8"): validation accuracy before and after, per seed
and the mean loss (issue 32's target: <= 0.5 points).

    python benchmarks/int8_accuracy.py --seeds 5
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import sentiment  # noqa: E402

import attnx  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    losses = []
    for seed in range(args.seed, args.seed + args.seeds):
        history = sentiment.run(seed, verbose=0)
        model = history.model
        sentences, labels = sentiment.load(seed)
        tokenizer = attnx.text.Tokenizer()
        tokenizer.fit_on_texts(sentences)
        x = attnx.text.pad_sequences(tokenizer.texts_to_sequences(sentences), maxlen=sentiment.MAXLEN,
                                     padding="post", truncating="post")
        cut = int(len(x) * 0.8)  # fit's validation_split=0.2: the last 20%
        x_val, y_val = x[cut:], labels[cut:]

        def accuracy():
            return float(np.mean((model.predict(x_val, verbose=0)[:, 0] > 0.5) == (y_val > 0.5)))

        before = accuracy()
        model.quantize("int8")
        after = accuracy()
        losses.append(before - after)
        print(f"seed {seed}: float32 {before:.4f} (fit's val_accuracy {history.history['val_accuracy'][-1]:.4f}), "
              f"int8 {after:.4f}, loss {100 * (before - after):+.2f} points", flush=True)
    print(f"mean int8 accuracy loss over {len(losses)} seeds: {100 * np.mean(losses):+.2f} points "
          f"(min {100 * np.min(losses):+.2f}, max {100 * np.max(losses):+.2f})")


if __name__ == "__main__":
    main()
