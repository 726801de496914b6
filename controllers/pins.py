"""Pinned paths: one host pair forced onto one path, whatever the destination routes say.

The packet switches route by destination only (`controllers.eps_core`: one
group per switch and destination, shortest paths), so two hosts always talk
over a shortest path.  A KV fast lane (Rail-Fabric, section 10 of the 002
text: "large KV takes reserved KV fast lanes") is a path the scheduler
chose and reserved, which need not be a shortest one.  A pin gives every
switch of the path one `Pin` intent: packets from the first host to the
last leave by the port toward the next node of the path, above the
destination routes (OpenFlow: an ``ipv4_src``+``ipv4_dst`` flow at a higher
priority, with the pin's serial in its cookie).

Only that direction is pinned (the KV bytes); the reverse traffic (ACKs)
keeps its destination route.  Unpinning removes exactly those hops (`Unpin`)
and the pair falls back to its destination route.

`PinTable` is pure: it checks paths against the fabric and returns intents
per switch; the service has its applier carry them out.
Between two switches joined by several links the pin leaves by a fast lane
if one of them is (`topologies.rail_fabric.fast_lane_ports`), else by the
lowest port.  One pin per host pair at a time: a second one would be the
same match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Dict, FrozenSet, Iterable, List, Sequence, Tuple

from controllers.intents import Batch, PinHop, UnpinHop
from topologies import rail_fabric
from topologies.fabric import EPS, HOST, OCS, Fabric, FabricError

SERIAL_LIMIT = 2 ** 56


@dataclass(frozen=True)
class Pin:
    """An installed pin: its path, the pair it matches and its hops."""

    id: str
    path: Tuple[str, ...]
    src_ip: str
    dst_ip: str
    serial: int
    hops: Tuple[Tuple[str, int], ...]       # (switch, output port), in path order

    @property
    def switches(self) -> List[str]:
        return [switch for switch, _ in self.hops]

    def hop(self, switch: str, port: int) -> PinHop:
        return PinHop(switch, self.id, self.serial, self.src_ip, self.dst_ip, port)

    def crosses(self, u: str, v: str) -> bool:
        link = {u, v}
        return any({a, b} == link for a, b in zip(self.path, self.path[1:]))


class PinTable:
    """Active pins of one fabric; every method returns intents, per switch."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        self.pins: Dict[str, Pin] = {}
        self._serial = 0
        self._lane_ports = {(node, port) for a, pa, b, pb in rail_fabric.fast_lane_ports(fabric)
                            for node, port in ((a, pa), (b, pb))}

    # ------------------------------------------------------------ checks
    def out_port(self, node: str, peer: str) -> int:
        """node's port toward peer; a fast lane first among parallel links."""
        ports = sorted(data["ports"][node] for data in self.fabric.graph[node][peer].values())
        lanes = [port for port in ports if (node, port) in self._lane_ports]
        return (lanes or ports)[0]

    def check_path(self, path: Sequence[str],
                   down_links: Collection[FrozenSet[str]] = ()) -> Tuple[Tuple[str, int], ...]:
        """(switch, output port) per switch of a valid path; FabricError says what is wrong."""
        if isinstance(path, str) or not isinstance(path, Sequence) or \
                not all(isinstance(node, str) for node in path):
            raise FabricError(f"a pinned path is a list of node names, got {path!r}")
        path = list(path)
        if len(path) < 3:
            raise FabricError(f"pinned path {path}: needs a host, at least one switch and a "
                              "host")
        unknown = [node for node in path if node not in self.fabric.graph]
        if unknown:
            raise FabricError(f"pinned path {path}: unknown nodes {unknown}")
        for end in (path[0], path[-1]):
            if self.fabric.kind(end) != HOST:
                raise FabricError(f"pinned path {path}: it must start and end at a host, "
                                  f"{end} is {self.fabric.kind(end)}")
        if path[0] == path[-1]:
            raise FabricError(f"pinned path {path}: source and destination are both {path[0]}")
        repeated = sorted({node for node in path if path.count(node) > 1})
        if repeated:
            raise FabricError(f"pinned path {path}: visits {repeated} twice (a loop)")
        for position, node in enumerate(path[1:-1], start=1):
            kind = self.fabric.kind(node)
            if kind == OCS:
                raise FabricError(f"pinned path {path}: {node} (position {position}) is an "
                                  "OCS; an OCS forwards by circuit and cannot hold a pin")
            if kind != EPS:
                raise FabricError(f"pinned path {path}: {node} (position {position}) is a "
                                  f"{kind}; only packet switches may sit between the hosts")
        for hop, (u, v) in enumerate(zip(path, path[1:]), start=1):
            if not self.fabric.graph.has_edge(u, v):
                raise FabricError(f"pinned path {path}: no link {u}-{v} (hop {hop})")
            if frozenset((u, v)) in down_links:
                raise FabricError(f"pinned path {path}: link {u}-{v} (hop {hop}) is down")
        return tuple((node, self.out_port(node, peer)) for node, peer in zip(path[1:-1], path[2:]))

    # ------------------------------------------------------------ pins
    def pin(self, pin_id: str, path: Sequence[str],
            down_links: Collection[FrozenSet[str]] = ()) -> Batch:
        """Flow adds per switch, last switch of the path first, so that the
        first switch diverts the pair only once the rest of the path holds it.

        Pinning an active id again with the same path changes nothing ({});
        with another path, or a pair another pin holds, is refused.
        """
        if not isinstance(pin_id, str) or not pin_id:
            raise FabricError(f"a pin id is a non-empty string, got {pin_id!r}")
        hops = self.check_path(path, down_links)
        path = tuple(path)
        if pin_id in self.pins:
            if self.pins[pin_id].path == path:
                return {}
            raise FabricError(f"pin {pin_id!r} is active on {list(self.pins[pin_id].path)}; "
                              "unpin it first")
        src_ip, dst_ip = (self.fabric.graph.nodes[h]["ip"] for h in (path[0], path[-1]))
        for other in self.pins.values():
            if (other.src_ip, other.dst_ip) == (src_ip, dst_ip):
                raise FabricError(f"pin {pin_id!r}: {path[0]} -> {path[-1]} is already pinned "
                                  f"by {other.id!r} on {list(other.path)}")
        self._serial = self._serial % (SERIAL_LIMIT - 1) + 1
        pin = Pin(pin_id, path, src_ip, dst_ip, self._serial, hops)
        self.pins[pin_id] = pin
        return {switch: [pin.hop(switch, port)] for switch, port in reversed(hops)}

    def unpin(self, pin_id: str) -> Batch:
        """Strict deletes per switch, first switch of the path first."""
        if pin_id not in self.pins:
            raise FabricError(f"no active pin {pin_id!r}; active: {sorted(self.pins)}")
        pin = self.pins.pop(pin_id)
        return {switch: [UnpinHop(switch, pin.id, pin.serial, pin.src_ip, pin.dst_ip)]
                for switch in pin.switches}

    def unpin_all(self) -> Batch:
        batch: Batch = {}
        for pin_id in sorted(self.pins):
            for switch, msgs in self.unpin(pin_id).items():
                batch.setdefault(switch, []).extend(msgs)
        return batch

    # ------------------------------------------------------------ queries
    def switch_start(self, switch: str) -> List[PinHop]:
        """The active pins' flows on one switch, for a switch that (re)connects
        after `EpsCore.switch_start` cleared its table."""
        return [pin.hop(node, port)
                for pin in self.pins.values() for node, port in pin.hops if node == switch]

    def crossing(self, links: Iterable[FrozenSet[str]]) -> List[str]:
        """Ids of the pins whose path uses any of these links (e.g. a link gone down)."""
        links = [tuple(link) for link in links]
        return sorted(pin.id for pin in self.pins.values()
                      if any(pin.crosses(*link) for link in links))

    def state(self) -> Dict[str, List[str]]:
        return {pin_id: list(pin.path) for pin_id, pin in sorted(self.pins.items())}
