"""torch.cuda of the stand-in (see the package docstring). Work is done at once, on the
host, so a stream only remembers the events recorded on it and an event is always done."""
from __future__ import annotations

import contextlib
import threading

# An 80 GiB GPU with everything free; readers that size their cache by it set their own
# budget (`cache_vram_mib`) or call set_free_bytes.
_free_bytes = 80 << 30
_total_bytes = 80 << 30
_local = threading.local()


def set_free_bytes(n: int, total: int | None = None) -> None:
    """Stand-in only: what mem_get_info reports as free (the readers size their cache by it)."""
    global _free_bytes, _total_bytes
    _free_bytes = int(n)
    _total_bytes = int(total) if total is not None else max(_total_bytes, _free_bytes)


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def mem_get_info(device=None) -> tuple[int, int]:
    return _free_bytes, _total_bytes


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.recorded = False

    def record(self, stream: Stream | None = None) -> None:
        self.recorded = True
        (stream or current_stream()).events.append(self)

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait(self, stream: Stream | None = None) -> None:
        pass


class Stream:
    def __init__(self, device=None, priority: int = 0) -> None:
        from . import device as _device

        self.device = _device(device if device is not None else "cuda")
        self.events: list[Event] = []
        self.waited: list[Event] = []

    def wait_event(self, event: Event) -> None:
        self.waited.append(event)

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event


_default = Stream()


def current_stream(device=None) -> Stream:
    return getattr(_local, "stream", _default)


@contextlib.contextmanager
def stream(s: Stream):
    previous = getattr(_local, "stream", None)
    _local.stream = s
    try:
        yield s
    finally:
        if previous is None:
            del _local.stream
        else:
            _local.stream = previous


def synchronize(device=None) -> None:
    pass
