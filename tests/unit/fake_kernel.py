"""A fake of the kernel state the netlink applier writes, for unit tests.

``FakeIPRoute`` stands for one namespace's pyroute2 ``IPRoute``: it records
every call, checks its arguments as the kernel would (a filter on a port
without an ingress qdisc, a route through an interface that is down, a
rule deleted twice), and keeps the resulting state: routes per table and
destination, pin rules, static neighbours, ingress qdiscs and patch-panel
filters.  ``FakeKernel`` is one per switch of a fabric, and ``trace`` walks a
packet through them hop by hop, every ECMP branch, as ``fakes.trace`` walks
OpenFlow tables: the kernel routes by destination (a pin rule first), an OCS
port redirects to its circuit's peer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from controllers.netlink.applier import GATEWAY
from topologies.fabric import HOST, OCS, Fabric
from topologies.naming import interface

IFF_UP, IFF_LOWER_UP = 0x1, 0x10000


class FakeNetlinkError(Exception):
    """What pyroute2 raises: an errno in ``code``."""

    def __init__(self, code: int, message: str):
        super().__init__(code, message)
        self.code = code


class Message(dict):
    """A pyroute2-like message: fields by key, attributes by ``get_attr``."""

    def __init__(self, fields=None, attrs=None):
        super().__init__(fields or {})
        self.attrs = dict(attrs or {})

    def get_attr(self, name):
        return self.attrs.get(name)


@dataclass
class FakeIPRoute:
    name: str
    links: Dict[str, int]                           # ifname -> index
    down: set = field(default_factory=set)          # indexes that are down
    calls: List[tuple] = field(default_factory=list)
    routes: Dict[Tuple[int, str], dict] = field(default_factory=dict)   # (table, dst) -> spec
    rules: Dict[Tuple[int, int], dict] = field(default_factory=dict)    # (table, prio) -> spec
    neighbours: Dict[Tuple[int, str], str] = field(default_factory=dict)  # (index, ip) -> mac
    ingress: set = field(default_factory=set)
    filters: Dict[int, int] = field(default_factory=dict)               # in index -> out index
    stats: Dict[int, dict] = field(default_factory=dict)
    closed: bool = False

    def link_lookup(self, ifname):
        return [self.links[ifname]] if ifname in self.links else []

    def get_links(self, *indexes):
        return [Message({"index": index, "flags": 0 if index in self.down
                         else IFF_UP | IFF_LOWER_UP},
                        {"IFLA_IFNAME": name, "IFLA_STATS64": self.stats.get(index, {})})
                for name, index in self.links.items() if not indexes or index in indexes]

    def route(self, command, **spec):
        self.calls.append(("route", command, spec))
        table = spec.get("table", 254)
        dst = spec["dst"].split("/")[0]
        if command == "del":
            if (table, dst) not in self.routes:
                raise FakeNetlinkError(3, "No such process")
            del self.routes[(table, dst)]
            return
        hops = spec.get("multipath") or ([spec] if "oif" in spec else [])
        for hop in hops:
            if hop["oif"] in self.down:
                raise FakeNetlinkError(100, "Network is down")
            if hop["oif"] not in self.links.values():
                raise FakeNetlinkError(19, "No such device")
        self.routes[(table, dst)] = spec

    def get_routes(self, table=254):
        return [Message({"proto": spec.get("proto", 0), "dst_len": 32,
                         "type": spec.get("type", "unicast")}, {"RTA_DST": dst})
                for (t, dst), spec in self.routes.items() if t == table]

    def flush_routes(self, table):
        self.calls.append(("flush_routes", table))
        for key in [k for k in self.routes if k[0] == table]:
            del self.routes[key]

    def rule(self, command, **spec):
        self.calls.append(("rule", command, spec))
        key = (spec["table"], spec["priority"])
        if command == "add":
            if key in self.rules:
                raise FakeNetlinkError(17, "File exists")
            self.rules[key] = spec
        elif command == "del":
            if key not in self.rules:
                raise FakeNetlinkError(2, "No such file or directory")
            del self.rules[key]

    def get_rules(self):
        return [Message({"table": 252}, {"FRA_TABLE": t, "FRA_PRIORITY": p})
                for t, p in self.rules]

    def neigh(self, command, dst, lladdr, ifindex, state):
        self.calls.append(("neigh", command, dst, lladdr, ifindex, state))
        self.neighbours[(ifindex, dst)] = lladdr

    def get_qdiscs(self, index):
        return [Message({}, {"TCA_KIND": "ingress"})] if index in self.ingress else []

    def tc(self, command, kind, index, **spec):
        self.calls.append(("tc", command, kind, index, spec))
        if command == "add" and kind == "ingress":
            if index in self.ingress:
                raise FakeNetlinkError(17, "File exists")
            self.ingress.add(index)
        elif command == "del" and kind == "ingress":
            self.ingress.discard(index)
            self.filters.pop(index, None)
        elif command == "add-filter":
            if index not in self.ingress:
                raise FakeNetlinkError(22, "no ingress qdisc")
            if index in self.filters:
                raise FakeNetlinkError(17, "File exists")
            self.filters[index] = spec["action"]["ifindex"]
        elif command == "del-filter":
            if index not in self.filters:
                raise FakeNetlinkError(2, "No such file or directory")
            del self.filters[index]

    def close(self):
        self.closed = True

    # ------------------------------------------------------------ lookups
    def next_ports(self, src_ip: str, dst_ip: str) -> Optional[List[int]]:
        """Output indexes for a packet (a pin rule first, then the main table);
        None when no route matches."""
        table = 254
        for (rule_table, _), spec in sorted(self.rules.items(), key=lambda kv: kv[0][1]):
            if spec["src"] == src_ip and spec["dst"] == dst_ip:
                table = rule_table
                break
        spec = self.routes.get((table, dst_ip))
        if spec is None:
            return None
        if spec.get("type") == "blackhole":
            return []
        hops = spec.get("multipath") or [spec]
        return [hop["oif"] for hop in hops]


class FakeLookup:
    """A router's `controllers.netlink.lookup.RouteLookup`: the next hop the fake
    kernel takes for a flow, one of a multipath route's hops by the flow's ports."""

    def __init__(self, sock: FakeIPRoute):
        self.sock = sock

    def output(self, dst, src, iif, sport, dport, proto=6):
        found = self.sock.next_ports(src, dst)
        if not found:
            raise OSError(101, "Network is unreachable")
        return found[(sport + dport) % len(found)]

    def close(self):
        pass


class FakeLinkStats:
    """A namespace's `controllers.netlink.linkstats.LinkStats`: the fake kernel's
    link statistics by interface index; ``gate``, when set, holds every read
    until it opens (a sampler caught mid-dump)."""

    def __init__(self, sock: FakeIPRoute, gate=None):
        self.sock = sock
        self.gate = gate
        self.reads = 0
        self.closed = False

    def by_index(self):
        self.reads += 1
        if self.gate is not None and not self.gate.wait(5):
            raise TimeoutError("the test never opened the gate")
        return {index: dict(self.sock.stats.get(index, {})) for index in self.sock.links.values()}

    def close(self):
        self.closed = True


class FakeRouteWriter:
    """A router's `controllers.netlink.routes.RouteWriter` over the fake kernel:
    each message it would write is decoded with pyroute2's own ``rtmsg`` and
    carried out as the route call it stands for, so the batch path and the
    one-route-at-a-time path meet the same checks and state."""

    def __init__(self, sock: FakeIPRoute):
        self.sock = sock
        self.writes: List[int] = []     # routes per write

    def replace(self, routes) -> List[int]:
        from pyroute2.netlink.rtnl.rtmsg import rtmsg
        from controllers.netlink import routes as wire_routes
        self.writes.append(len(routes))
        codes = []
        for seq, route in enumerate(routes, 1):
            msg = rtmsg(wire_routes.route_replace(seq, route))
            msg.decode()
            assert msg["header"]["flags"] & wire_routes.NLM_F_REPLACE
            spec = {"dst": f"{msg.get_attr('RTA_DST')}/{msg['dst_len']}", "proto": msg["proto"]}
            table = msg.get_attr("RTA_TABLE")
            if table != 254:
                spec["table"] = table
            if msg["type"] == wire_routes.RTN_BLACKHOLE:
                spec["type"] = "blackhole"
            hops = [{"oif": nh["oif"], "flags": nh["flags"], "gateway": nh.get_attr("RTA_GATEWAY")}
                    for nh in msg.get_attr("RTA_MULTIPATH") or []]
            if msg.get_attr("RTA_OIF") is not None:
                hops = [{"oif": msg.get_attr("RTA_OIF"), "flags": msg["flags"],
                         "gateway": msg.get_attr("RTA_GATEWAY")}]
            for hop in hops:        # as the slow path spells a hop: no gateway, no flags
                if hop["gateway"] is None:
                    del hop["gateway"], hop["flags"]
            if len(hops) == 1:
                spec.update(hops[0])
            elif hops:
                spec["multipath"] = hops
            try:
                self.sock.route("replace", **spec)
                codes.append(0)
            except FakeNetlinkError as exc:
                codes.append(exc.code)
        return codes

    def close(self):
        pass


class FakeKernel:
    """One FakeIPRoute per switch namespace of a fabric, ports numbered 1.. per switch."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        self.sockets: Dict[str, FakeIPRoute] = {}
        for switch in fabric.switches:
            links = {"lo": 1}
            for port in fabric.ports_of(switch):
                links[interface(fabric, switch, port)] = 100 + port
            self.sockets[switch] = FakeIPRoute(switch, links)

    def port_of_index(self, index: int) -> int:
        return index - 100

    def set_down(self, switch: str, port: int, down: bool = True) -> None:
        """An interface taken down (or up), as ``ip link set`` does: going down
        flushes its neighbour entries, permanent ones too, and every route
        left without a live next hop."""
        sock, index = self.sockets[switch], 100 + port
        if down:
            sock.down.add(index)
            for key in [key for key in sock.neighbours if key[0] == index]:
                del sock.neighbours[key]
            for key, spec in list(sock.routes.items()):
                hops = spec.get("multipath") or ([spec] if "oif" in spec else [])
                if hops and all(hop["oif"] in sock.down for hop in hops):
                    del sock.routes[key]
        else:
            sock.down.discard(index)


def trace(kernel: FakeKernel, src: str, dst: str, max_hops: int = 32):
    """Every branch of a packet src -> dst: (delivered node paths, failures)."""
    fabric = kernel.fabric
    src_ip, dst_ip = (fabric.graph.nodes[h]["ip"] for h in (src, dst))
    delivered, failures = [], []
    first, port = fabric.host_port(src)
    stack = [(first, port, [src], frozenset())]
    while stack:
        node, in_port, path, seen = stack.pop()
        path = path + [node]
        seen = seen | {(node, in_port)}
        if len(path) > max_hops:
            failures.append(f"over {max_hops} hops: {path}")
            continue
        sock = kernel.sockets[node]
        if fabric.kind(node) == OCS:
            out = sock.filters.get(100 + in_port)
            outs = [] if out is None else [kernel.port_of_index(out)]
        else:
            found = sock.next_ports(src_ip, dst_ip)
            outs = None if found is None else [kernel.port_of_index(i) for i in found]
        if not outs:
            failures.append(f"dropped at {node} after {path}")
            continue
        for out in outs:
            peer, peer_port = fabric.peer(node, out)
            if fabric.kind(node) != OCS:
                # A router resolves its next hop from the port's static neighbour.
                hop = fabric.graph.nodes[peer]["ip"] if fabric.kind(peer) == HOST \
                    else GATEWAY
                if (100 + out, hop) not in sock.neighbours:
                    failures.append(f"{node}: no neighbour {hop} on port {out}: {path}")
                    continue
            if fabric.kind(peer) == HOST:
                if peer == dst:
                    delivered.append(path + [peer])
                else:
                    failures.append(f"delivered to {peer} instead of {dst}: {path}")
            elif (peer, peer_port) in seen:
                failures.append(f"loop back into {peer}:{peer_port}: {path}")
            else:
                stack.append((peer, peer_port, path, seen))
    return sorted(delivered), failures

