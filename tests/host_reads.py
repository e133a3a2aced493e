"""HostReads: a tensor that counts the times its value, or a value computed from it, is read on the
host (item, tolist, float, int, bool, ...). On a GPU each such read waits for every queued kernel,
so the trainers make one a step; on CPU this count is how the tests see it. HostWaits: the same
seen from the dispatcher, which also sees a Python value copied into a tensor (a Dispatched: the
recorder of named operations, which other tests use too)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostReads(torch.Tensor):
    count = 0
    READS = {"item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "__array__"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in cls.READS:
            cls.count += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def counted(tensor: torch.Tensor) -> HostReads:
    """`tensor` (same data, same autograd history) as a HostReads."""
    return tensor.as_subclass(HostReads)


class Dispatched(TorchDispatchMode):
    """Inside it, `ops` lists every dispatched operation whose name starts with one of `prefixes`
    (e.g. "aten.mm"), in order."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.prefixes):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class HostWaits(Dispatched):
    """Inside it, `waits` lists every dispatched operation that would make the host wait for a GPU:
    a Python value lifted into a tensor (`x[i] = True`, `torch.tensor(v)`: a copy from pageable
    host memory, which CUDA makes synchronous) and a read of a value."""

    OPS = ("aten.lift_fresh", "aten._local_scalar_dense")

    def __init__(self):
        super().__init__(self.OPS)
        self.waits = self.ops


class CudaHostWaits:
    """Inside it, `sites` lists where (file:line of the Python caller) the host waited for a GPU:
    every operation torch's sync debug mode warns of, and every CUDA event waited on, which that
    mode does not see (QueuedRead.take's wait for a step's values). Event waits are listed as
    they happen, the mode's warnings at the exit. Used by tests/test_gpu.py and by
    benchmarks/trainer_throughput.py's --profile."""

    def __enter__(self):
        import sys
        import warnings

        self.sites: list[str] = []
        self._warnings = warnings.catch_warnings(record=True)
        self._caught = self._warnings.__enter__()
        warnings.simplefilter("always")
        synchronize = self._synchronize = torch.cuda.Event.synchronize

        def counted(event):
            caller = sys._getframe(1)
            self.sites.append(f"{caller.f_code.co_filename}:{caller.f_lineno}")
            return synchronize(event)

        torch.cuda.Event.synchronize = counted
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.Event.synchronize = self._synchronize
        self._warnings.__exit__(*exc)
        self.sites += [f"{w.filename}:{w.lineno}" for w in self._caught
                       if "synchroniz" in str(w.message)]
        return False
