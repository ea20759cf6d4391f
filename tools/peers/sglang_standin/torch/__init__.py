"""A stand-in for the few parts of torch that SGLang's expert-pack readers use, so
`python/sglang/srt/layers/moe/expert_pack.py` (`ExpertPackStore`, `KimiGGMLExpertPackStore`)
can be driven without torch or a GPU.

Use: put `tools/peers/sglang_standin` first on `sys.path`, then import SGLang's module:

    sys.path.insert(0, "tools/peers/sglang_standin")     # this `torch`
    sys.path.insert(0, "../shared/reference/sglang")
    import expert_pack
    torch.cuda.set_free_bytes(n)                    # what mem_get_info reports (the cache budget)
    store = expert_pack.KimiGGMLExpertPackStore(pack, manifest_path=..., expected_layers=...,
                                                expected_experts=..., expected_top_k=16)
    store.initialize_device_cache("cuda")
    slots_tensor, slots = store.acquire(layer, torch.tensor([[e0, ..., e15]]))
    row = store.device_cache[slots[0]].numpy_view()   # the bytes the reader installed

What it implements (what the readers' read path touches, nothing more):
- `Tensor` over a numpy array: `shape`, `ndim`, `dtype`, `device`, `data_ptr()`,
  `numpy()` (CPU tensors only, sharing memory, as torch), `__getitem__` (a view),
  `copy_()`, `detach()`, `cpu()`, `reshape()`, iteration and `int()`, `tolist()`.
- `empty(size, dtype=, device=, pin_memory=)`: "pinned" host buffers are page-aligned
  (as cudaHostAlloc's are, which SGLang's O_DIRECT reads rely on); "device" memory is host
  memory too. Both are mapped when allocated (pinned memory is page-locked, a GPU's memory
  takes no host page faults), so copies into them cost what the real ones cost the host. `tensor(data, dtype=, device=)`, `device`, `uint8`, `int32`, `int64`.
- `torch.cuda`: `is_available`, `mem_get_info`, `Stream`, `stream()`, `current_stream`,
  `Event` (see `cuda.py`). Copies happen at once, so streams and events only keep order.
"""
from __future__ import annotations

import numpy as np

__version__ = "0.0-xpackfs-standin"


class dtype:
    def __init__(self, name: str, np_dtype) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)

    def __repr__(self) -> str:
        return f"torch.{self.name}"


uint8 = dtype("uint8", np.uint8)
int32 = dtype("int32", np.int32)
int64 = dtype("int64", np.int64)
float32 = dtype("float32", np.float32)
_BY_NP = {d.np: d for d in (uint8, int32, int64, float32)}


class device:
    def __init__(self, spec="cpu", index: int | None = None) -> None:
        if isinstance(spec, device):
            self.type, self.index = spec.type, spec.index
            return
        kind, _, idx = str(spec).partition(":")
        if kind not in ("cpu", "cuda"):
            raise RuntimeError(f"stand-in torch: unsupported device {spec!r}")
        self.type = kind
        self.index = int(idx) if idx else index

    def __eq__(self, other) -> bool:
        other = device(other)
        return (self.type, self.index or 0) == (other.type, other.index or 0)

    def __hash__(self) -> int:
        return hash((self.type, self.index or 0))

    def __repr__(self) -> str:
        return f"device(type={self.type!r}" + (f", index={self.index})" if self.index is not None else ")")


_CPU = device("cpu")


class Size(tuple):
    pass


class Tensor:
    def __init__(self, array: np.ndarray, dev: device = _CPU, pinned: bool = False) -> None:
        self._a = array
        self.device = dev
        self._pinned = pinned

    @property
    def shape(self) -> Size:
        return Size(self._a.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self._a.shape[dim]

    @property
    def ndim(self) -> int:
        return self._a.ndim

    @property
    def dtype(self) -> dtype:
        return _BY_NP[self._a.dtype]

    def data_ptr(self) -> int:
        return self._a.ctypes.data

    def is_pinned(self) -> bool:
        return self._pinned

    def numpy(self) -> np.ndarray:
        if self.device.type != "cpu":
            raise TypeError("can't convert cuda tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")
        return self._a

    def numpy_view(self) -> np.ndarray:
        """Stand-in only: the array behind any tensor (device memory included), for checks."""
        return self._a

    def __getitem__(self, index) -> Tensor:
        return Tensor(self._a[index], self.device, self._pinned)

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        for i in range(len(self._a)):
            yield Tensor(self._a[i : i + 1].reshape(()), self.device)

    def __int__(self) -> int:
        return int(self._a)

    def item(self):
        return self._a.item()

    def tolist(self):
        return self._a.tolist()

    def copy_(self, src: Tensor, non_blocking: bool = False) -> Tensor:
        if src._a.shape != self._a.shape:
            raise RuntimeError(f"copy_: shape {src._a.shape} into {self._a.shape}")
        np.copyto(self._a, src._a)
        return self

    def detach(self) -> Tensor:
        return self

    def cpu(self) -> Tensor:
        return self if self.device.type == "cpu" else Tensor(self._a.copy(), _CPU)

    def reshape(self, *shape) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return Tensor(self._a.reshape(shape), self.device, self._pinned)

    def __repr__(self) -> str:
        return f"tensor({self._a!r}, device={self.device})"


def _aligned(nbytes: int, alignment: int = 4096, resident: bool = False) -> np.ndarray:
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    buf = raw[start : start + nbytes]
    if resident:
        # One write per page maps every page now, as cudaHostAlloc's page-locked memory is mapped
        # at allocation and a GPU's memory is never a host page fault: without it, the first
        # copies into the device cache (its first layer, 110 MB for the bench pack) were charged
        # the first-touch faults of fresh host pages, which the real reader never pays there.
        buf[::4096] = 0
    return buf


def empty(*size, dtype: dtype = float32, device=None, pin_memory: bool = False) -> Tensor:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    shape = tuple(int(s) for s in size)
    count = int(np.prod(shape)) if shape else 1
    dev = globals()["device"](device) if device is not None else _CPU
    buf = _aligned(count * dtype.np.itemsize, resident=pin_memory or dev.type != "cpu").view(dtype.np).reshape(shape)
    return Tensor(buf, dev, pin_memory)


def tensor(data, dtype: dtype | None = None, device=None) -> Tensor:
    a = np.array(data, dtype=dtype.np if dtype is not None else None)
    if a.dtype not in _BY_NP:
        a = a.astype(np.int64 if np.issubdtype(a.dtype, np.integer) else np.float32)
    return Tensor(a, globals()["device"](device) if device is not None else _CPU)


from . import cuda  # noqa: E402  (torch.cuda)
