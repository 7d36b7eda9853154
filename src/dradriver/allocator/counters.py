"""Shared counters of partitionable devices: what each pool's counter sets still hold."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dradriver.allocator.model import Device, Pool


@dataclass(frozen=True)
class CounterShortfall:
    """A shared counter that has less left than a device consumes."""

    counter_set: str
    counter: str
    left: Fraction
    needed: Fraction

    @property
    def subject(self) -> str:
        """Which counter: ``counter memory of counter set gpu-0``."""
        return f"counter {self.counter} of counter set {self.counter_set}"

    def __str__(self) -> str:
        return f"{self.subject} has {_show(self.left)} left, the device needs {_show(self.needed)}"


class CounterLedger:
    """Counters left in every pool after the devices of other claims, plus those being allocated now."""

    def __init__(self, pools: list[Pool], allocated: list[Device]) -> None:
        self.available: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = {}
        for pool in pools:
            self.available[(pool.driver, pool.name)] = {
                name: dict(counters) for name, counters in pool.counter_sets.items()
            }
        for device in allocated:
            sets = self.available.get((device.pool.driver, device.pool.name))
            if sets is None:
                continue
            for set_name, counters in device.consumption():
                for name, amount in counters.items():
                    if set_name in sets and name in sets[set_name]:
                        sets[set_name][name] -= amount

    def shortfall(self, device: Device) -> CounterShortfall | None:
        """None if ``device`` fits in what is left, else which counter runs out."""
        sets = self.available.get((device.pool.driver, device.pool.name), {})
        for set_name, counters in device.consumption():
            left = sets.get(set_name)
            if left is None:
                continue
            for name, amount in counters.items():
                if name in left and left[name] < amount:
                    return CounterShortfall(set_name, name, left[name], amount)
        return None

    def take(self, device: Device) -> None:
        self._apply(device, -1)

    def give_back(self, device: Device) -> None:
        self._apply(device, 1)

    def _apply(self, device: Device, sign: int) -> None:
        sets = self.available.get((device.pool.driver, device.pool.name), {})
        for set_name, counters in device.consumption():
            left = sets.get(set_name)
            if left is None:
                continue
            for name, amount in counters.items():
                if name in left:
                    left[name] += sign * amount


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))
