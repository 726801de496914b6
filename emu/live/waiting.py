"""Polling helpers: wait for a condition, never for a fixed time."""

from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A condition did not become true in time; the message says which."""


def wait_until(condition: Callable[[], T], timeout_s: float, what: str,
               interval_s: float = 0.05, detail: Optional[Callable[[], str]] = None) -> T:
    """Return the first truthy value of condition(), or raise WaitTimeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f": {detail()}" if detail else ""
            raise WaitTimeout(f"timed out after {timeout_s:g} s waiting for {what}{extra}")
        time.sleep(interval_s)
