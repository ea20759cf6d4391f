"""A minimal stand-in for the parts of torch SGLang's expert-pack reader uses (see
../README.md): aligned host tensors backed by numpy, a device cache that is not stored,
and no-op CUDA streams and events. Not a general torch replacement."""
from __future__ import annotations

import mmap

import numpy as np

from . import cuda  # noqa: F401  (torch.cuda.*)

uint8 = np.uint8
int32 = np.int32
_ALIGN = 4096


class device:
    def __init__(self, spec="cpu"):
        self.type = spec.type if isinstance(spec, device) else str(spec).split(":")[0]

    def __repr__(self):
        return f"device(type={self.type!r})"


def _aligned(nbytes: int, dtype) -> np.ndarray:
    # Anonymous mappings are page-aligned, like CUDA's pinned host allocations.
    m = mmap.mmap(-1, max(nbytes, 1))
    arr = np.frombuffer(m, dtype=np.uint8)[:nbytes].view(dtype)
    assert arr.ctypes.data % _ALIGN == 0
    return arr


class Tensor:
    def __init__(self, array: np.ndarray | None, shape, dev: device):
        self._array = array
        self.shape = tuple(shape)
        self.device = dev

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numpy(self) -> np.ndarray:
        if self._array is None:
            raise RuntimeError("device tensors of the stand-in hold no data")
        return self._array

    def data_ptr(self) -> int:
        return self._array.ctypes.data if self._array is not None else 0

    def __getitem__(self, index):
        if self._array is not None:
            a = self._array[index]
            return Tensor(a, a.shape, self.device)
        if not isinstance(index, int):
            raise TypeError("the stand-in's device tensors are indexed by one integer")
        return Tensor(None, self.shape[1:], self.device)

    def copy_(self, src: "Tensor", non_blocking: bool = False) -> "Tensor":
        if self._array is not None and src._array is not None:
            self._array[...] = src._array
        return self  # copies to the (not stored) device cache are dropped

    def detach(self):
        return self

    def cpu(self):
        return self

    def reshape(self, *shape):
        return Tensor(self.numpy().reshape(*shape), self.numpy().reshape(*shape).shape, self.device)

    def __iter__(self):
        return iter(self.numpy())


def empty(size, dtype=uint8, device=None, pin_memory: bool = False) -> Tensor:
    shape = tuple(size) if isinstance(size, (tuple, list)) else (int(size),)
    dev = globals()["device"](device or "cpu")
    if dev.type != "cpu":
        return Tensor(None, shape, dev)
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return Tensor(_aligned(n, dtype).reshape(shape), shape, dev)


def tensor(data, dtype=None, device=None) -> Tensor:
    a = np.asarray(data, dtype=dtype)
    return Tensor(a, a.shape, globals()["device"](device or "cpu"))
