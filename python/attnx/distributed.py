"""Data-parallel training over MPI (mpi4py): every rank holds the model, takes its shard of each
global batch, and the gradients are summed with one allreduce before one identical optimizer step
on every rank (the scheme of Horovod and PyTorch's DistributedDataParallel).

    # train.py, run as: mpiexec -n 2 python train.py
    strategy = attnx.distributed.DataParallel()
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"], distribute=strategy)
    model.fit(x, y, batch_size=64, epochs=10)   # 64 = the global batch

What `fit` / `evaluate` / `predict` do with a strategy (see ARCHITECTURE.md, "Distributed"):
- before the first step, rank 0's weights and optimizer state are broadcast to every rank, after a
  check that every rank built the same model (config and parameter shapes);
- each global batch (the same shuffle on every rank: rank 0's seed and step) is split into contiguous
  shards, one per rank; a rank whose shard is empty still takes part in the reduction; dropout and
  sampling draw by global row (`attnx.random`), so N ranks draw the masks one process draws;
- each rank backpropagates the loss of its shard weighted by its share of the global loss, the
  gradients travel in one flat preallocated buffer through one in-place ``Allreduce``, and every
  rank then applies the same optimizer step (clipping sees the global gradient);
- losses and metrics are summed across ranks where Keras would report them (epoch logs, history,
  validation): callbacks see the same values on every rank and so decide the same thing; only rank 0
  shows a progress bar and writes files (`Model.save`, checkpoints);
- an exception on any rank aborts every rank (``MPI_Abort``, non-zero exit) rather than leaving the
  others waiting forever in a collective: inside fit / evaluate / predict, and anywhere else once a
  DataParallel of more than one rank exists (an uncaught exception reaches `sys.excepthook`, which
  aborts the job, as ``python -m mpi4py`` does).

A program run without ``mpiexec`` sees one rank and trains exactly as without a strategy.
"""
import hashlib
import json
import sys
import time

import numpy as np

from . import data_adapter, random


def _comm_world():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError("attnx.distributed needs mpi4py and an MPI library: pip install 'attnx[distributed]' "
                          "(mpi4py and mpich)") from exc
    return MPI, MPI.COMM_WORLD


def _output_kind(output):
    """What `gather` can join: ('array', trailing shape, dtype), ('list', kinds), or None (anything else)."""
    if isinstance(output, np.ndarray) and output.ndim >= 1:
        return ("array", output.shape[1:], output.dtype.str)
    if isinstance(output, list) and output and all(isinstance(o, np.ndarray) and o.ndim >= 1 for o in output):
        return ("list", tuple((o.shape[1:], o.dtype.str) for o in output))
    return None


class DataParallel:
    """Synchronous data parallelism over the ranks of an MPI communicator (default: COMM_WORLD)."""

    def __init__(self, comm=None):
        self._mpi, world = _comm_world()
        if comm is not None and not isinstance(comm, self._mpi.Comm):
            raise TypeError(f"DataParallel: comm must be an mpi4py communicator (e.g. MPI.COMM_WORLD), got "
                            f"{type(comm).__name__}")
        self.comm = comm if comm is not None else world
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._buffer = None
        self.allreduce_seconds = 0.0  # time spent in the gradient allreduce, for the curious
        if self.size > 1:
            _abort_on_uncaught_exceptions(self)

    @property
    def is_main(self):
        """True on rank 0, the rank that prints and writes files."""
        return self.rank == 0

    def __repr__(self):
        return f"<DataParallel rank {self.rank} of {self.size}>"

    # ------------------------------------------------------------------ batches
    def shard_batch(self, *parts):
        """This rank's contiguous share of a global batch: every array of `parts` (arrays, lists or
        dicts of them, or None) cut along its first axis at the same rows (np.array_split's cuts)."""
        if not parts:
            raise ValueError("DataParallel.shard_batch: give the batch's arrays (x, y, ...)")
        n = self.rows(parts[0])
        lo, hi = (n * self.rank) // self.size, (n * (self.rank + 1)) // self.size
        random.shard_rows(lo, hi - lo)  # the rows this rank's dropout and samples draw
        return tuple(data_adapter.map_structure(lambda a: np.asarray(a)[lo:hi], p) for p in parts)

    @staticmethod
    def rows(x):
        """The number of samples in `x` (an array or a list / dict of arrays)."""
        leaves = data_adapter._leaves(x)
        if not leaves or np.ndim(leaves[0]) == 0:
            raise ValueError(f"DataParallel: a batch must hold arrays with a batch axis, got {type(x).__name__} "
                             f"{'with no arrays' if not leaves else 'of a scalar'}")
        return int(np.shape(leaves[0])[0])

    # --------------------------------------------------------------------- run
    def run(self, model, fn, *args):
        """`fn(*args)` (a model's fit, evaluate or predict) on every rank, after `setup(model)`; an
        exception on this rank aborts all of them rather than leaving the others in a collective."""
        self.setup(model)  # its checks raise on every rank alike, leaving none inside a collective
        try:
            return fn(*args)
        except BaseException as exc:
            if self.size == 1:
                raise
            self.abort(exc)
        finally:
            random.shard_rows(0, 0)

    # ------------------------------------------------------------------- setup
    def setup(self, model):
        """Checks that every rank built the same model, then gives every rank rank 0's weights and
        optimizer state. Raises ValueError on every rank when the models differ."""
        described = json.dumps({"config": model.get_config(),
                                "shapes": [[n, list(p.shape), p.dtype.name] for n, p in model.params.items()]},
                               sort_keys=True, default=str)
        digest = hashlib.sha256(described.encode()).hexdigest()
        digests = self.comm.allgather(digest)
        if len(set(digests)) > 1:
            differing = [r for r, d in enumerate(digests) if d != digests[0]]
            raise ValueError(f"DataParallel: ranks {differing} built a model different from rank 0's "
                             "(config or parameter shapes); every rank must build the same model")
        for p in model.params.values():
            self.comm.Bcast(p, root=0)
        # rank 0's seed and step: every rank shuffles alike and draws the global rows of its shard
        random.set_state(self.comm.bcast(random.get_state(), root=0))
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:  # a model loaded with its optimizer state on rank 0 resumes everywhere
            optimizer.iterations = self.comm.bcast(optimizer.iterations, root=0)
            has_state = self.comm.bcast([id(p) in optimizer._slots for p in model.params.values()], root=0)
            for p, present in zip(model.params.values(), has_state):
                if present:
                    for buffer in optimizer._state(p):
                        self.comm.Bcast(buffer, root=0)

    # --------------------------------------------------------------- reductions
    def allreduce_gradients(self, grads, loss):
        """Sums `grads` over the ranks in place and returns the sum of `loss`, through one flat
        buffer (reused from step to step) and one in-place Allreduce."""
        if self.size == 1:
            return loss
        dtype = np.result_type(*grads) if grads else np.float64
        total = sum(g.size for g in grads) + 1
        if self._buffer is None or self._buffer.size != total or self._buffer.dtype != dtype:
            self._buffer = np.empty(total, dtype)
        buf, at = self._buffer, 0
        for g in grads:
            buf[at:at + g.size] = g.reshape(-1)
            at += g.size
        buf[at] = loss
        start = time.perf_counter()
        self.comm.Allreduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM)
        self.allreduce_seconds += time.perf_counter() - start
        at = 0
        for g in grads:
            g.reshape(-1)[...] = buf[at:at + g.size]
            at += g.size
        return float(buf[at])

    def sum(self, values):
        """The sums over ranks of a list of floats and float arrays (metrics.AUC's per-threshold counts), in
        one buffer; floats come back as floats, arrays as arrays."""
        if self.size == 1:
            return [float(v) if np.ndim(v) == 0 else np.asarray(v, dtype=np.float64) for v in values]
        parts = [np.asarray(v, dtype=np.float64) for v in values]
        arr = np.concatenate([p.reshape(-1) for p in parts]) if parts else np.zeros(0)
        self.comm.Allreduce(self._mpi.IN_PLACE, arr, op=self._mpi.SUM)
        out, at = [], 0
        for p in parts:
            out.append(float(arr[at]) if p.ndim == 0 else arr[at:at + p.size].reshape(p.shape))
            at += p.size
        return out

    def sum_metrics(self, metrics):
        """Replaces every metric's running sums (`state_names`) by their sums over the ranks."""
        values = [getattr(m, n) for m in metrics for n in m.state_names]
        summed = iter(self.sum(values))
        for m in metrics:
            for n in m.state_names:
                setattr(m, n, next(summed))

    def gather(self, outputs):
        """Every rank's outputs (an array, a list of arrays, or None for an empty shard) joined
        along the batch axis in rank order, on every rank."""
        gathered = self.comm.allgather(outputs)  # every rank checks the same list, so all raise alike
        parts = [p for p in gathered if p is not None]
        kinds = {_output_kind(p) for p in parts}
        if not parts or len(kinds) != 1 or None in kinds:
            raise ValueError(f"DataParallel.gather: expected on every rank an array, a list of arrays (the same "
                             f"number and trailing shapes on every rank) or None for an empty shard, got "
                             f"{[_output_kind(p) for p in gathered]}")
        if isinstance(parts[0], list):
            return [np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]
        return np.concatenate(parts)

    def abort(self, exc):
        """Ends every rank (non-zero exit) after printing `exc`'s traceback on this one."""
        import traceback
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        sys.stderr.write(f"attnx.distributed: rank {self.rank} failed; aborting all {self.size} ranks\n")
        sys.stderr.flush()
        # the launcher forwards a rank's output asynchronously: aborting at once can end it unsent
        time.sleep(0.5)
        self.comm.Abort(1)


def _abort_on_uncaught_exceptions(strategy):
    """Makes an exception no code catches, on any rank, end the whole job (``MPI_Abort``) instead of
    leaving the other ranks waiting in a collective forever; installed once per process."""
    previous = sys.excepthook
    if getattr(previous, "_attnx_aborts", False):
        return

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        sys.stderr.write(f"attnx.distributed: uncaught {kind.__name__} on rank {strategy.rank}; aborting all "
                         f"{strategy.size} ranks\n")
        sys.stderr.flush()
        time.sleep(0.5)  # the launcher forwards a rank's output asynchronously
        strategy.comm.Abort(1)
    hook._attnx_aborts = True
    sys.excepthook = hook
