"""Runs every benchmarks/bench_*.py (or those named) in one process: python benchmarks/run.py [name ...]"""
import importlib
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import harness  # noqa: E402


def main(names):
    import torch

    import attnx
    threads = harness.setup_threads()
    attnx.show_config()
    print(f"torch {torch.__version__}: {torch.get_num_threads()} threads; benchmarks with {threads} threads each, "
          f"{harness.ROUNDS} interleaved rounds")
    here = pathlib.Path(__file__).parent
    for path in sorted(here.glob("bench_*.py")):
        short = path.stem[len("bench_"):]
        if names and short not in names:
            continue
        print(f"\n== {short}")
        importlib.import_module(path.stem).main()


if __name__ == "__main__":
    main(sys.argv[1:])
