"""No-op CUDA streams and events for the stand-in (see ../README.md)."""
from __future__ import annotations

import contextlib


class Event:
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class Stream:
    def __init__(self, device=None):
        self.device = device

    def wait_event(self, event):
        pass


def stream(s):
    return contextlib.nullcontext(s)


def current_stream(device=None):
    return Stream(device)


def mem_get_info(device=None):
    return 80 << 30, 80 << 30
