"""Thread locks that a forked child gets fresh.

A lock another thread of the parent held at ``fork()`` stays held in the child forever (only
the forking thread is copied), so the child's first call that takes it hangs: a data-loader
worker forked while the engine's thread recorded a plan or built a variant, for one. Used by
the JIT core and the ops.
"""
from __future__ import annotations

import os
import threading
import weakref

_all: weakref.WeakSet = weakref.WeakSet()


class ForkSafeLock:
    """A ``threading.Lock`` (``reentrant``: ``RLock``) replaced by a new, free one in a forked
    child. Use it as the lock it wraps: ``with lock:``, ``acquire``, ``release``."""

    def __init__(self, reentrant: bool = False):
        self._factory = threading.RLock if reentrant else threading.Lock
        self._lock = self._factory()
        _all.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


def _after_fork_in_child() -> None:
    for lock in list(_all):
        lock._lock = lock._factory()


os.register_at_fork(after_in_child=_after_fork_in_child)
