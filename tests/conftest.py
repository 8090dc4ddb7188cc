"""Shared fixtures: a fixed random seed for every test and a default ATTNX_DATA_DIR.

The data folder default is ``<repo>/../shared/data`` (every loader looks in its subfolder there)
unless ATTNX_DATA_DIR is already set (scripts/test.sh sets the same folder).
"""
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO.parent / "shared" / "data"  # holds uci-sentiment/ and anki/, as scripts/test.sh sets it

if not os.environ.get("ATTNX_DATA_DIR"):
    os.environ["ATTNX_DATA_DIR"] = str(DEFAULT_DATA_DIR)


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same attnx and NumPy random state."""
    import attnx
    attnx.set_random_seed(1234)
    np.random.seed(1234)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def torch():
    """PyTorch (CPU), seeded, on one thread for reproducible reductions; threads restored after."""
    import torch as _torch
    threads = _torch.get_num_threads()
    _torch.manual_seed(0)
    _torch.set_num_threads(1)
    yield _torch
    _torch.set_num_threads(threads)


def _cpu_simd_levels():
    from attnx import _core
    levels = ["baseline", "avx2", "avx512"]
    return levels[:levels.index(_core._config()["cpu_simd_level"]) + 1]


CPU_SIMD_LEVELS = _cpu_simd_levels()  # every copy of the vector kernels this CPU can run


@pytest.fixture(params=CPU_SIMD_LEVELS)
def level(request):
    """The test runs with the kernels capped at each SIMD level this CPU has (the widest after)."""
    from attnx import _core
    _core._force_simd_level(request.param)
    yield request.param
    _core._force_simd_level("avx512")
