"""What the controller's cores decide, before any data plane: intents.

The cores (`eps_core`, `ocs_core`, `pins`, `reconfig`) never build a
message for a switch.  They return *intents*, small frozen records of what a
switch must do, and an *applier* carries them out on one data plane and
confirms them before the next step of a sequence starts:

* `controllers.openflow` drives Open vSwitch over OpenFlow 1.3 (select
  groups, port-to-port flows, barriers).

So the same cores serve every data plane, and a model that never touches a
switch (a flow-level replay of the same fabric) can ask them for routes and
circuits too.

Intents, per switch::

    Reset(switch)                 forget every route, pin and circuit the switch holds;
                                  what follows in the same list installs from scratch
    Resync(switch, dark_ports)    what follows in the same list is all the switch must
                                  hold: change what differs, leave what is right as it
                                  is (a restarted controller); pins go and come back,
                                  the dark ports of an OCS carry no circuit
    Route(switch, dst, ...ports)  packets to host dst leave by any of ports (ECMP,
                                  per flow); no port: dropped (unreachable)
    Lightpath(ocs, a, b, lit)     OCS ports a and b joined both ways (lit) or torn (dark)
    PinHop(switch, pin, ...port)  packets from src_ip to dst_ip leave by port, whatever
                                  the destination route says (a reserved path)
    UnpinHop(switch, pin, ...)    that pair falls back to its destination route

A `Batch` maps each switch to its intents, in the order they must be
applied.  An applier applies a batch and returns once every switch in it has
confirmed (OpenFlow: a barrier reply).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Tuple, Union


@dataclass(frozen=True)
class Reset:
    """The switch forgets what it holds; intents after it in a list install anew."""

    switch: str


@dataclass(frozen=True)
class Resync:
    """The switch keeps forwarding; intents after it in a list are everything it
    must hold, and only what differs changes.

    A controller that comes back after a crash finds switches still forwarding
    by its predecessor's decisions.  A `Reset` would cut every flow for the
    moment of the reinstall; this replaces each route and circuit in place.
    ``dark_ports`` (an OCS) are the ports no circuit may join, whatever the
    switch holds: a reconfiguration cut short may have lit one.
    """

    switch: str
    dark_ports: Tuple[int, ...] = ()


@dataclass(frozen=True)
class Route:
    """Next hops of one packet switch toward one destination host.

    ``ports`` are the switch's output ports on a shortest path (sorted); a
    flow keeps one of them (ECMP by flow hash).  Empty: the destination is
    unreachable and its packets are dropped at this switch, never flooded.
    """

    switch: str
    dst: str
    dst_ip: str
    ports: Tuple[int, ...]


@dataclass(frozen=True)
class Lightpath:
    """One OCS circuit: ports ``a`` and ``b`` joined in both directions (``lit``),
    or torn apart (dark: what arrives at either port is lost)."""

    ocs: str
    a: int
    b: int
    lit: bool


@dataclass(frozen=True)
class PinHop:
    """One switch's hop of a pinned path: packets ``src_ip`` -> ``dst_ip`` leave by
    ``port``, above the destination routes.  ``serial`` tells the pin apart from
    an earlier pin of the same pair."""

    switch: str
    pin: str
    serial: int
    src_ip: str
    dst_ip: str
    port: int


@dataclass(frozen=True)
class UnpinHop:
    """Remove exactly the hop `PinHop` installed (same pin, serial and pair)."""

    switch: str
    pin: str
    serial: int
    src_ip: str
    dst_ip: str


Intent = Union[Reset, Resync, Route, Lightpath, PinHop, UnpinHop]
Batch = Dict[str, List[Intent]]


def merge(*batches: Mapping[str, Iterable[Intent]]) -> Batch:
    """One batch from several, each switch's intents in the order given."""
    merged: Batch = {}
    for batch in batches:
        for switch, intents in batch.items():
            merged.setdefault(switch, []).extend(intents)
    return merged
