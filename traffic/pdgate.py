"""KV ingress credits (`traffic.credits`) as the replayer's gate over a planned P/D stream.

One request is one stream: the first of its KV flows to come due asks
credit for the whole request, all its flows start once it is granted, and
the credit is released when its last flow ends.  Pure: the clock is
injected (``clock``, epoch seconds by default), nothing sleeps.
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence

from traffic.credits import Credits
from traffic.kvflows import KvTransfer, link_id
from traffic.pdplan import Planned, request_of


def fabric_links(transfer: KvTransfer) -> List[str]:
    """The switch-to-switch links a transfer crosses: what path credits meter
    (a D's own ports are its ingress credits' business)."""
    return sorted({link_id(u, v) for path in transfer.paths
                   for u, v in zip(path[1:-2], path[2:-1])})


class CreditGate:
    """KV ingress credits per D, and optionally path credits, for the replayer:
    one request = one stream.

    ``gate(flow)`` asks credit for the flow's request the first time one of its
    flows is due and admits all its flows once granted; ``done(result)``
    releases the credit when the request's last flow has finished.  With
    ``path_limit``, a request also needs a credit on every switch-to-switch
    link of its path (at most ``path_limit`` KV streams per link): "a P waits
    for both D credit and path credit".
    """

    def __init__(self, planned: Sequence[Planned], limit: int,
                 clock: Callable[[], float] = time.time, path_limit: Optional[int] = None):
        self.credits = Credits(d_credits=limit, link_credits=path_limit)
        self.limit = limit
        self.clock = clock
        self.d_of = {x.id: x.d for x in planned}
        self.links_of = {x.id: fabric_links(x.transfer) for x in planned}
        self.left = {x.id: len(x.flow_ids) for x in planned}
        self.granted: set = set()
        self.asked: set = set()

    def gate(self, flow) -> bool:
        rid = request_of(flow.id)
        if rid not in self.asked:
            self.asked.add(rid)
            grants = self.credits.ask(rid, self.d_of[rid], self.links_of[rid], now=self.clock())
            self.granted |= {g.request_id for g in grants}
            self.credits.check()
        return rid in self.granted

    def done(self, result) -> None:
        rid = request_of(result.id)
        self.left[rid] -= 1
        if self.left[rid] == 0 and rid in self.granted:
            grants = self.credits.release(rid, now=self.clock())
            self.granted |= {g.request_id for g in grants}
            self.credits.check()
