"""A rate-limited work queue of keys, as client-go's workqueue promises.

- A key added while it waits is queued once (dedupe).
- A key being worked on is never handed to a second worker: added meanwhile, it is queued again when the first
  worker calls :meth:`WorkQueue.done`.
- :meth:`WorkQueue.add_rate_limited` queues a key after its own exponential backoff (``base * 2**failures``,
  capped), which :meth:`WorkQueue.forget` resets once the key succeeded.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

BACKOFF_BASE = 0.005  # client-go's default item rate limiter: 5 ms, doubling
BACKOFF_CAP = 60.0


class WorkQueue(Generic[K]):
    """Keys for workers: :meth:`get` one, work on it, :meth:`done` it."""

    def __init__(
        self,
        *,
        backoff_base: float = BACKOFF_BASE,
        backoff_cap: float = BACKOFF_CAP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()  # queued, or to be queued again once done
        self._processing: set[K] = set()
        self._delayed: list[tuple[float, int, K]] = []  # (due, order, key) heap
        self._order = itertools.count()
        self._failures: dict[K, int] = {}
        self._base, self._cap = backoff_base, backoff_cap
        self._clock = clock
        self._shut = False

    def add(self, key: K) -> None:
        """Queue ``key`` unless it waits already."""
        with self._cond:
            self._add(key)

    def _add(self, key: K) -> None:
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` in ``delay`` seconds (at once when not positive)."""
        with self._cond:
            if delay <= 0:
                self._add(key)
                return
            heapq.heappush(self._delayed, (self._clock() + delay, next(self._order), key))
            self._cond.notify()

    def add_rate_limited(self, key: K) -> float:
        """Queue ``key`` after its backoff, which doubles with each call until :meth:`forget`; the delay."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
            delay: float = min(self._base * 2.0**failures, self._cap)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """``key`` succeeded: its next failure starts the backoff over."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def get(self, timeout: float | None = None) -> K | None:
        """The next key (now being worked on), or None after :meth:`shut_down` or ``timeout`` seconds."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._shut:
                    return None
                self._promote_due()
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                now = self._clock()
                waits = [
                    w for w in (self._next_due(now), None if deadline is None else deadline - now) if w is not None
                ]
                if deadline is not None and now >= deadline:
                    return None
                self._cond.wait(min(waits) if waits else None)

    def _promote_due(self) -> None:
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key = heapq.heappop(self._delayed)
            self._add(key)

    def _next_due(self, now: float) -> float | None:
        return max(0.0, self._delayed[0][0] - now) if self._delayed else None

    def done(self, key: K) -> None:
        """The worker is done with ``key``; queued again if it was added meanwhile."""
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shut_down(self) -> None:
        """Wake every worker with None; nothing is queued from now on."""
        with self._cond:
            self._shut = True
            self._cond.notify_all()

    def __len__(self) -> int:
        """Keys waiting to be worked on (delayed ones not counted)."""
        with self._cond:
            return len(self._queue)
