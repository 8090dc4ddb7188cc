"""attnx.distributed trusts no argument and lets no rank hang (issue 31): a bad communicator or batch
is a clear error; a fit under DataParallel of one rank equals a plain fit bit for bit, dropout and
shuffling included (both draw from attnx.random by global row); an exception on one rank outside fit (before it)
ends the whole job instead of leaving the other rank waiting in a collective forever."""
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import attnx
from attnx import layers

distributed = pytest.importorskip("mpi4py") and attnx.distributed


def test_bad_strategy_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="DataParallel: comm must be an mpi4py communicator .* got int"):
        distributed.DataParallel(comm=5)
    strategy = distributed.DataParallel()
    with pytest.raises(ValueError, match="a batch must hold arrays with a batch axis, got dict with no arrays"):
        strategy.shard_batch({})
    with pytest.raises(ValueError, match="give the batch's arrays"):
        strategy.shard_batch()
    x = np.arange(10).reshape(5, 2)
    np.testing.assert_array_equal(strategy.shard_batch(x)[0], x)


def _dropout_model(distribute=None):
    attnx.set_random_seed(3)
    model = attnx.Sequential([layers.Dense(16, activation="relu", input_shape=(6,)), layers.Dropout(0.3),
                              layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy", distribute=distribute)
    return model


@pytest.mark.parametrize("shuffle", [False, True])
def test_one_rank_equals_a_plain_fit_with_dropout_and_shuffling(shuffle):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    plain = _dropout_model()
    plain.fit(x, y, batch_size=16, epochs=2, shuffle=shuffle, verbose=0)
    one_rank = _dropout_model(distributed.DataParallel())
    one_rank.fit(x, y, batch_size=16, epochs=2, shuffle=shuffle, verbose=0)
    for a, b in zip(plain.get_weights(), one_rank.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec (pip install mpich) is not installed")
def test_an_exception_on_one_rank_before_fit_ends_the_job(tmp_path):
    script = tmp_path / "fail_before_fit.py"
    script.write_text(textwrap.dedent('''
        import attnx
        strategy = attnx.distributed.DataParallel()
        if strategy.rank == 1:
            raise RuntimeError("rank 1 fails before fit")
        strategy.comm.barrier()   # rank 0 waits here for a rank that will never come
    '''))
    start = time.perf_counter()
    done = subprocess.run([shutil.which("mpiexec"), "-n", "2", sys.executable, str(script)], capture_output=True,
                          text=True, timeout=120)
    seconds = time.perf_counter() - start
    assert done.returncode != 0
    assert "rank 1 fails before fit" in done.stderr and "aborting all 2 ranks" in done.stderr
    assert seconds < 60, f"the job took {seconds:.0f} s to end"


def test_gather_checks_what_it_joins():
    strategy = distributed.DataParallel()
    x = np.ones((3, 2), np.float32)
    np.testing.assert_array_equal(strategy.gather(x), x)
    assert [a.shape for a in strategy.gather([x, x[:, :1]])] == [(3, 2), (3, 1)]
    for bad in (None, 0.5, np.float32(1.0), [], [x, "y"], "text"):
        with pytest.raises(ValueError, match="DataParallel.gather"):
            strategy.gather(bad)
