"""KV ingress credits: lease first, then send KV.

Section 7 of the 002 text ("KV Transfer Credit"): when several prefills
finish together and all push GB of KV into one D, "D ingress, last hop,
D NIC, D KV allocator all overload".  So D keeps ingress credits and "only
when both D and path have credit can P start sending KV"; each D takes 2-4
large KV streams at once; long prompts reserve path credit in advance,
short prompts may go best-effort.

`Credits` is that state machine, pure (times are passed in, nothing
sleeps):

* ``ask(request, d, links, now)`` queues a transfer; ``release(request,
  now)`` frees its credits.  Both return the `Grant` s that start now.
* A transfer needs one credit of its D (``d_credits``, per-D overrides in
  ``d_limits``: D-heavy switches may get more) and one of every link it
  crosses (``link_credits`` streams per link, overrides in
  ``link_limits``; ``None`` = no path credit).  A "link" is any resource
  key: link ids for per-link credit, or one path id for per-path credit.
  One request is one stream, whatever number of TP-rank flows it has.
* **FIFO**: waiting transfers are granted in arrival order.  By default a
  transfer never overtakes an earlier waiting one that needs any of the
  same resources, but may pass one it shares nothing with (no
  head-of-line blocking between different Ds); ``strict_fifo`` grants in
  global arrival order only.
* ``best_effort=True`` (a short prompt) starts at once and takes no credit.

The limits are never exceeded; `peak_d` / `peak_link` and `series` give the
concurrency the scenarios report (D-ingress streams over time).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, Hashable, Iterable, List, Mapping, Optional, Tuple

#: Large KV streams a D accepts at once, per the text.
TEXT_D_CREDITS = (2, 4)


class CreditError(ValueError):
    """A credit call does not fit the state (unknown or repeated request)."""


@dataclass(frozen=True)
class Grant:
    request_id: str
    d: Hashable
    links: Tuple[str, ...]
    asked_s: float
    granted_s: float
    best_effort: bool = False

    @property
    def wait_s(self) -> float:
        return self.granted_s - self.asked_s


@dataclass(frozen=True)
class _Waiting:
    request_id: str
    d: Hashable
    links: Tuple[str, ...]
    asked_s: float


def _limit(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CreditError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class _Tracked(defaultdict):
    """A defaultdict(int) that remembers the keys written since `Credits.check`
    last looked (every change of a count is a write: ``d[k] += 1``)."""

    def __init__(self, default_factory=int, *args, **kwargs):
        self.touched: set = set()
        super().__init__(default_factory, *args, **kwargs)
        self.touched.update(self)

    def __setitem__(self, key, value):
        self.touched.add(key)
        super().__setitem__(key, value)


class Credits:
    """D-ingress and path credits with a FIFO wait queue."""

    def __init__(self, d_credits: int = 3, link_credits: Optional[int] = None,
                 d_limits: Optional[Mapping[Hashable, int]] = None,
                 link_limits: Optional[Mapping[str, int]] = None, strict_fifo: bool = False):
        self.d_credits = _limit("d_credits", d_credits)
        self.link_credits = None if link_credits is None else _limit("link_credits",
                                                                     link_credits)
        self.d_limits = {d: _limit(f"d_limits[{d!r}]", v) for d, v in (d_limits or {}).items()}
        self.link_limits = {k: _limit(f"link_limits[{k!r}]", v)
                            for k, v in (link_limits or {}).items()}
        self.strict_fifo = strict_fifo
        self.active: Dict[str, Grant] = {}
        self.waiting: List[_Waiting] = []
        self.d_in_use: Dict[Hashable, int] = _Tracked()
        self.link_in_use: Dict[str, int] = _Tracked()
        self.peak_d: Dict[Hashable, int] = defaultdict(int)
        self.peak_link: Dict[str, int] = defaultdict(int)
        self.events: List[Tuple[float, str, str, Hashable]] = []   # (t, grant/release, id, d)

    # ------------------------------------------------------------ limits
    def d_limit(self, d: Hashable) -> int:
        return self.d_limits.get(d, self.d_credits)

    def link_limit(self, link: str) -> Optional[int]:
        return self.link_limits.get(link, self.link_credits)

    def _metered(self, links: Iterable[str]) -> List[str]:
        return [link for link in links if self.link_limit(link) is not None]

    def _fits(self, item: _Waiting) -> bool:
        if self.d_in_use[item.d] >= self.d_limit(item.d):
            return False
        return all(self.link_in_use[link] < self.link_limit(link)
                   for link in self._metered(item.links))

    # ------------------------------------------------------------ calls
    def ask(self, request_id: str, d: Hashable, links: Iterable[str] = (), now: float = 0.0,
            best_effort: bool = False) -> List[Grant]:
        """Queue a transfer to D ``d`` over ``links``; returns what starts now."""
        if request_id in self.active or any(w.request_id == request_id for w in self.waiting):
            raise CreditError(f"request {request_id} already holds or awaits credit")
        links = tuple(sorted(set(links)))
        if best_effort:
            grant = Grant(request_id, d, links, now, now, best_effort=True)
            self.active[request_id] = grant
            return [grant]
        self.waiting.append(_Waiting(request_id, d, links, now))
        return self._dispatch(now)

    def release(self, request_id: str, now: float = 0.0) -> List[Grant]:
        """The transfer is done: free its credits; returns what starts now."""
        grant = self.active.pop(request_id, None)
        if grant is None:
            raise CreditError(f"request {request_id} holds no credit")
        if grant.best_effort:
            return []
        self.d_in_use[grant.d] -= 1
        for link in self._metered(grant.links):
            self.link_in_use[link] -= 1
        self.events.append((now, "release", request_id, grant.d))
        return self._dispatch(now)

    def cancel(self, request_id: str, now: float = 0.0) -> List[Grant]:
        """Drop a waiting transfer (it gave up); may unblock those behind it."""
        before = len(self.waiting)
        self.waiting = [w for w in self.waiting if w.request_id != request_id]
        if len(self.waiting) == before:
            raise CreditError(f"request {request_id} is not waiting")
        return self._dispatch(now)

    def _dispatch(self, now: float) -> List[Grant]:
        granted, still, blocked = [], [], set()
        for item in self.waiting:
            needs = {("d", item.d)} | {("link", link) for link in self._metered(item.links)}
            if (self.strict_fifo and still) or needs & blocked or not self._fits(item):
                blocked |= needs
                still.append(item)
                continue
            granted.append(self._grant(item, now))
        self.waiting = still
        return granted

    def _grant(self, item: _Waiting, now: float) -> Grant:
        self.d_in_use[item.d] += 1
        self.peak_d[item.d] = max(self.peak_d[item.d], self.d_in_use[item.d])
        for link in self._metered(item.links):
            self.link_in_use[link] += 1
            self.peak_link[link] = max(self.peak_link[link], self.link_in_use[link])
        grant = Grant(item.request_id, item.d, item.links, item.asked_s, now)
        self.active[item.request_id] = grant
        self.events.append((now, "grant", item.request_id, item.d))
        return grant

    # ------------------------------------------------------------ reports
    def series(self, d: Hashable) -> List[Tuple[float, int]]:
        """Credit-holding streams into ``d`` after each grant or release: (t, count)."""
        count, points = 0, []
        for t, kind, _, target in self.events:
            if target == d:
                count += 1 if kind == "grant" else -1
                points.append((t, count))
        return points

    def check(self, full: bool = False) -> None:
        """Raise if any limit is exceeded (tests and `traffic.pdgate.CreditGate`
        call it after every step).

        Incremental: a count that was within its limit at the last check and
        has not been written since still is (the limits are fixed at
        construction), so only the Ds and links written since the last check are
        looked at: the gate checks after every ask and release, and looking at
        every D each time (818 at 16,384 GPUs) was much of the model's time.
        ``full`` (or counts replaced by a plain dict) looks at every one."""
        self._check_counts(self.d_in_use, full, lambda d, used, limit:
                           f"D {d!r} holds {used} credits, limit {limit}", self.d_limit)
        self._check_counts(self.link_in_use, full, lambda link, used, limit:
                           f"link {link} holds {used} credits, limit {limit}",
                           self.link_limit)

    @staticmethod
    def _check_counts(counts, full, message, limit_of) -> None:
        tracked = isinstance(counts, _Tracked)
        keys = counts.keys() if full or not tracked else \
            [key for key in counts.touched if key in counts]
        for key in keys:
            used, limit = counts[key], limit_of(key)
            if limit is not None and not 0 <= used <= limit:
                raise CreditError(message(key, used, limit))
        if tracked:
            counts.touched.clear()
