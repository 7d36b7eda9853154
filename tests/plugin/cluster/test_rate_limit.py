"""The client-side API rate limit: a burst at once, then QPS a second, as client-go's token bucket."""

from __future__ import annotations

import pytest

from dradriver.plugin.cluster.rate_limit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


def test_a_burst_goes_at_once_then_requests_are_paced_at_qps() -> None:
    clock = Clock()
    bucket = TokenBucket(5, 3, clock=clock, sleep=clock.sleep)
    assert [bucket.wait() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [round(bucket.wait(), 6) for _ in range(2)] == [0.2, 0.2]
    clock.now += 10  # quiet for a while: the bucket refills up to the burst, no more
    assert [bucket.wait() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert round(bucket.wait(), 6) == 0.2


def test_qps_zero_means_no_limit_and_a_burst_below_one_is_refused() -> None:
    clock = Clock()
    assert all(TokenBucket(0, 1, clock=clock, sleep=clock.sleep).wait() == 0 for _ in range(100))
    assert clock.slept == []
    with pytest.raises(ValueError, match="at least 1"):
        TokenBucket(5, 0)
