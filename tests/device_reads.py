"""The counting mode of the "no device read between log steps" tests: every host read of a value the device
computed, counted while a run trains (`count_reads`). On a GPU each is a wait for the device's queue; on the CPU the
"device" tensors are those computed from the model's parameters, or moved by the loop (the batch's own tensors,
host arrays, are not), so the count is the one a GPU run would wait for.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from bertkit.training import trainer


class DeviceReads(TorchFunctionMode):
    """Counts host reads (float, int, bool, item, tolist, numpy, __array__ / np.asarray, .cpu(), .to("cpu"),
    torch.equal / allclose) of values computed from the model's parameters, and the operations whose output size
    depends on them (nonzero, single-argument torch.where, boolean-mask indexing). A tensor is the device's once it
    comes from an operation on a parameter, a gradient or another such tensor, or once the loop moved it there;
    the batch's own tensors (host arrays) are not."""

    READS = {"__float__", "__int__", "__bool__", "__index__", "item", "tolist", "numpy", "__array__", "cpu",
             "equal", "allclose"}
    # Operations whose output size depends on the values of a device tensor: on a GPU each waits for the device
    # to learn it (boolean-mask indexing is a nonzero inside)
    SIZED_BY_VALUES = {"nonzero", "argwhere", "masked_select", "unique", "nonzero_static", "unique_consecutive"}
    INDEXING = {"__getitem__", "__setitem__", "index_put", "index_put_", "index"}

    def __init__(self) -> None:
        super().__init__()
        self.device_tensors: dict[int, weakref.ref] = {}  # by id: a tensor's == is elementwise
        self.reads = 0
        self.where: list[str] = []  # the operations counted, in order (for a failing test's message)

    def mark(self, x: torch.Tensor) -> None:
        if not self.is_device(x):
            key = id(x)
            self.device_tensors[key] = weakref.ref(x, lambda _, key=key: self.device_tensors.pop(key, None))

    def is_device(self, x: torch.Tensor) -> bool:
        ref = self.device_tensors.get(id(x))
        return isinstance(x, nn.Parameter) or (ref is not None and ref() is x)

    @staticmethod
    def to_host(args, kwargs) -> bool:
        """Whether a `.to(...)` call moves to the host: the device named "cpu" as a string (`.to("cpu")`,
        `.to(device="cpu")`). A torch.device is not counted: on the CPU the run's own device (`.to(x.device)`, the
        optimizer's moves) is one too, and cannot be told from the host."""
        targets = [*args[1:], kwargs.get("device")]
        return any(isinstance(t, str) and t.startswith("cpu") for t in targets)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        from_device = any(self.is_device(x) for x in inputs)
        name = getattr(func, "__name__", "")
        read = False
        if from_device and (name in self.READS or name in self.SIZED_BY_VALUES):
            read = True
        elif from_device and name == "to" and self.to_host(args, kwargs):
            read = True
        elif from_device and name == "where" and len(args) + len(kwargs) == 1:
            read = True  # torch.where(cond) is nonzero
        elif name in self.INDEXING and len(args) > 1 and any(
                isinstance(x, torch.Tensor) and x.dtype == torch.bool and self.is_device(x)
                for x in pytree.tree_leaves(args[1])):
            read = True  # x[mask] or x[mask] = y with a device mask (args[1]: the index)
        if read:
            self.reads += 1
            self.where.append(name)
        out = func(*args, **kwargs)
        if from_device and not read or from_device and name not in ("cpu", "to"):  # a host copy is the host's
            for x in pytree.tree_leaves(out):
                if isinstance(x, torch.Tensor):
                    self.mark(x)
        return out


def count_reads(run, monkeypatch, reads: list | None = None) -> int:
    """Host reads of device values while `run()` trains; the batch counts as the device's once the loop has moved
    it there (on a GPU, a read of it waits too). `reads`: when given, the names of the counted operations are
    appended to it."""
    mode = DeviceReads()
    move = trainer._move

    def moved(batch, device):
        out = move(batch, device)
        out = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}  # the device's copy
        for k, v in batch.items():  # as the loop's move does: a device tensor remembers its host copy
            if isinstance(v, torch.Tensor):
                trainer.attach_host(out[k], v)
        for v in out.values():
            if isinstance(v, torch.Tensor):
                mode.mark(v)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(trainer, "_move", moved)
        with mode:
            run()
    if reads is not None:
        reads.extend(mode.where)
    return mode.reads
