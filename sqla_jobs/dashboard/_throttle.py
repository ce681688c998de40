"""Failed sign-ins, counted per client address: after ``limit`` failures within ``window``
seconds of the first, the address is refused (429) until the window ends, right password or not,
so guessing the password from one address takes years rather than hours.

An IPv6 client is counted by its /64, the block one subscriber usually holds. The table is
bounded (its oldest entry goes when it is full), so a flood of addresses costs memory it cannot
grow. Time is a parameter, so tests never sleep.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

LIMIT = 5
WINDOW = 60.0
CAPACITY = 10_000


def client_key(address: str | None) -> str:
    """What failures are counted under for ``address``: the address itself, an IPv6 one's /64
    (an IPv4 address mapped into IPv6 as itself); ``-`` for none."""
    if not address:
        return "-"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # not an IP (a Unix socket, a test client): counted as it is
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass
class _Failures:
    first_at: float
    count: int


class Throttle:
    """The failed sign-ins of one app. Not thread-safe: the ASGI app calls it from its event
    loop only."""

    def __init__(
        self,
        *,
        limit: int = LIMIT,
        window: float = WINDOW,
        capacity: int = CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.window, self.capacity, self._clock = limit, window, capacity, clock
        self._table: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def retry_after(self, key: str) -> int | None:
        """Whole seconds until ``key`` may try again, or None if it may now."""
        found = self._current(key)
        if found is None or found.count < self.limit:
            return None
        return max(1, math.ceil(found.first_at + self.window - self._clock()))

    def failed(self, key: str) -> bool:
        """Count a failure of ``key``; whether this one reached the limit (the block starts)."""
        found = self._current(key)
        if found is None:
            if len(self._table) >= self.capacity:
                self._table.popitem(last=False)
            found = self._table[key] = _Failures(self._clock(), 0)
        found.count += 1
        return found.count == self.limit

    def _current(self, key: str) -> _Failures | None:
        found = self._table.get(key)
        if found is not None and self._clock() - found.first_at >= self.window:
            del self._table[key]
            return None
        return found
