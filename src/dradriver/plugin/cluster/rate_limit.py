"""A client-side limit on API server requests, as client-go's token bucket (``--kube-api-qps``/``--kube-api-burst``).

A node's driver is one of thousands of clients of the API server; a burst of work on one node (a rescan republishing
many slices, a claim re-check after a kubelet outage) must not turn into a burst of requests. Up to ``burst``
requests go at once, then ``qps`` a second."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Blocks each caller of :meth:`wait` until a token is free; ``qps`` 0 or less means no limit."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``clock`` and ``sleep`` are seams for tests."""
        if burst < 1:
            raise ValueError(f"burst {burst} must be at least 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._updated = clock()

    def wait(self) -> float:
        """Take a token, waiting for one if none is free; returns the seconds waited."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.qps)
            self._updated = now
            self._tokens -= 1.0  # reserved now: callers queue in order, each for its own share of time
            delay = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if delay > 0:
            self._sleep(delay)
        return delay
