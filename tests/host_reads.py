"""HostReads: a tensor that counts the times its value, or a value computed from it, is read on the
host (item, tolist, float, int, bool, ...). On a GPU each such read waits for every queued kernel,
so the trainers make one a step; on CPU this count is how the tests see it."""

import torch


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
