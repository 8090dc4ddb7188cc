"""What a user runs end to end: the main job's Model.fit (examples/sentiment.py: Embedding, LSTM(100,
return_sequences, dropout 0.2), AttentionPooling, Dense sigmoid; Adam; 10 epochs of batch 32 on the
UCI amazon + yelp sentences with validation each epoch) against the same model, data and loop in
PyTorch (examples/sentiment_torch.py), one seed. Data from ATTNX_DATA_DIR (default ../shared/data).

    python benchmarks/run.py fit
"""
import os
import pathlib
import sys

from harness import compare

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
os.environ.setdefault("ATTNX_DATA_DIR", str(REPO.parent / "shared" / "data"))


def main():
    import sentiment
    import sentiment_torch
    return [compare("main job fit, 10 epochs (sentiment model)", lambda: sentiment.run(0, epochs=10, verbose=0),
                    lambda: sentiment_torch.run(0, epochs=10), warmup=0, repeat=3, rounds=3)]


if __name__ == "__main__":
    from harness import setup_threads
    print(f"threads: {setup_threads()} (attnx and torch)")
    main()
