"""The netlink applier: intents to Linux kernel routers and tc patch panels.

On the ``linux`` data plane every switch is a network namespace (Mininet
node).  A packet switch is a kernel router; an OCS is a patch panel of tc
ingress filters.  `NetlinkApplier` holds one netlink route socket per
namespace (`controllers.netlink.namespaces`), carries intents out with it and
returns once the kernel acknowledged every message: a change is in effect
when its netlink acknowledgement arrives, so ``sync`` has nothing to wait for.

==============================  ==================================================
intent                          netlink
==============================  ==================================================
Reset (router)                  delete our routes and pin rules; static neighbours
                                on every port: the host behind a host port, the
                                gateway `GATEWAY` -> `ROUTER_MAC` behind the others
Reset (OCS)                     remove every port's ingress qdisc (and its filter),
                                add an empty one: every port dark
Resync (router)                 our routes stay (each Route after it replaces one
                                in place); pin rules go; static neighbours again
Resync (OCS)                    BPF panel taken over (`bpfpanel.take_over_program`):
                                the dark ports' entries deleted, nothing else (the
                                Lightpaths after it rewrite the lit ones in place);
                                mirred panel: as Reset, its circuits dark for the
                                reinstall (milliseconds)
Route                           ``dst/32``, one ``nexthop via GATEWAY dev port
                                onlink`` per ECMP port (a host port: ``dev port``);
                                no port: a blackhole route
Lightpath lit / dark            a catch-all u32 filter on the ingress of each port,
                                ``mirred egress redirect`` to the other / removed;
                                one message each (`controllers.netlink.patch`);
                                with the BPF panel, the port's entry in the OCS's
                                map (`controllers.netlink.bpfpanel`)
PinHop / UnpinHop               ``ip rule from src to dst lookup T`` with table T
                                routing dst by the pinned port / both removed
==============================  ==================================================

A router's runs of Route intents go through its
`controllers.netlink.routes.RouteWriter` where it has one: one write for the
run, the kernel's answers read after, instead of a request and a wait each.

Every router port carries the one `topologies.naming.ROUTER_MAC`, so the
neighbour behind a fabric port never depends on which router a circuit leads
to: a reconfiguration rewrites routes only.  The sockets are anything with
pyroute2's ``IPRoute`` methods; unit tests give a recording fake.

An OCS attached with the BPF panel also takes a reconfiguration as one timed
write (`timed_circuits`) and cyclic schedules (`set_schedule`), which the
ToRs follow through their time-flow tables.

`counters` is asked for from another control connection (the load sampler,
twice a second) while `apply` runs, so it reads through a socket of each
namespace that nothing else uses (`controllers.netlink.linkstats.LinkStats`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

from controllers.bpf import entry as circuits_in_kernel
from controllers.intents import (Batch, Intent, Lightpath, PinHop, Reset, Resync, Route,
                                UnpinHop)
from controllers.netlink.routes import NextHop, RouteSpec
from topologies.fabric import HOST, OCS, Fabric
from topologies.naming import ROUTER_MAC, interface

LOG = logging.getLogger("fabric.netlink")

# The next hop every router names on a fabric port: a key for the neighbour
# entry (ROUTER_MAC), never an address any interface holds.
GATEWAY = "100.64.0.1"
PROTO_FABRIC = 71           # rtm_protocol of our routes (unassigned in iproute2's rt_protos)
NUD_PERMANENT = 0x80
RTNH_F_ONLINK = 4
MAIN_TABLE = 254
PIN_TABLE_BASE = 1000       # a pin's table and rule priority: base + its serial
PIN_TABLES = 30000          # serials wrap into base .. base + PIN_TABLES
INGRESS_PARENT = 0xFFFF0000
ETH_P_ALL = 0x0003
PATCH_PRIO = 1
PATCH_CLASS = 0x10001       # u32 wants a class id; the mirred action decides alone
ENETDOWN = 100
ESRCH = 3
MAX_HOPS = 32
WRITE_ROUNDS = 3            # writes of a batch's refused routes before one at a time
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000


class NetlinkError(RuntimeError):
    """The kernel refused a change, or a switch has no namespace."""


def pin_table(serial: int) -> int:
    return PIN_TABLE_BASE + serial % PIN_TABLES


class NetlinkApplier:
    """Applies intents to the namespaces of one fabric's switches."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        self.sockets: Dict[str, object] = {}          # switch -> IPRoute-like socket
        self.patches: Dict[str, object] = {}          # OCS -> PatchSocket (fast path)
        self.lookups: Dict[str, object] = {}          # router -> RouteLookup
        self.writers: Dict[str, object] = {}          # router -> RouteWriter (fast path)
        self.stats: Dict[str, object] = {}            # switch -> LinkStats (counters only)
        self.timeflows: Dict[str, object] = {}        # ToR -> factory of its TimeflowTable
        self.tables: Dict[str, object] = {}           # ToR -> TimeflowTable, once scheduled
        self.indexes: Dict[str, Dict[int, int]] = {}  # switch -> port -> ifindex
        self.ready: set = set()
        self.panel_note = ""      # why an OCS runs the mirred panel, if one does
        self.errors: List[str] = []
        self._locks: Dict[str, threading.Lock] = {}

    # ------------------------------------------------------------ namespaces
    def attach(self, switch: str, socket, patch=None, lookup=None, writer=None,
               stats=None, timeflow=None) -> None:
        """Take the route socket of a switch's namespace and learn its ports; an
        OCS may come with a `controllers.netlink.patch.PatchSocket`, which then
        lights and tears its circuits, and a router with a
        `controllers.netlink.lookup.RouteLookup`, which tells flows' paths, and
        a `controllers.netlink.routes.RouteWriter`, which then writes its
        destination routes a batch at a time; any switch with a
        `controllers.netlink.linkstats.LinkStats`, which then reads its
        counters; a router with ``timeflow``, a callable that makes its
        `controllers.netlink.bpfpanel.TimeflowTable` when a schedule needs it."""
        if switch not in self.fabric.switches:
            raise NetlinkError(f"{switch!r} is not a switch of {self.fabric.name}")
        ports = {}
        for port in self.fabric.ports_of(switch):
            name = interface(self.fabric, switch, port)
            found = socket.link_lookup(ifname=name)
            if not found:
                raise NetlinkError(f"{switch}: no interface {name} in its namespace")
            ports[port] = found[0]
        self.sockets[switch] = socket
        if patch is not None:
            self.patches[switch] = patch
        if lookup is not None:
            self.lookups[switch] = lookup
        if writer is not None:
            self.writers[switch] = writer
        if stats is not None:
            self.stats[switch] = stats
        if timeflow is not None:
            self.timeflows[switch] = timeflow
        self.indexes[switch] = ports
        self._locks[switch] = threading.Lock()

    def start(self, switch: str, intents: List[Intent]) -> None:
        """Bring a freshly attached switch to ``intents``; it is ready afterwards."""
        self.apply({switch: intents})
        self.ready.add(switch)

    def port_of(self, switch: str, ifname: str) -> Optional[int]:
        """The fabric port of an interface name of this switch, if it is one."""
        for port in self.fabric.ports_of(switch):
            if interface(self.fabric, switch, port) == ifname:
                return port
        return None

    # ------------------------------------------------------------ applying
    def apply(self, batch: Batch) -> Optional[Tuple[float, float]]:
        """Carry out each switch's intents in order; every call returns once the
        kernel acknowledged it (or raised its error).

        Returns when the kernel took the batch's circuit changes, where the
        patch panel's fast path timed them: the epoch times just before the
        first was written and just after the last (None: no circuit changed
        that way)."""
        for switch in batch:
            if switch not in self.sockets:
                raise NetlinkError(f"{switch} has no namespace attached")
        written: List[Tuple[float, float]] = []
        for switch, intents in batch.items():
            # Ports the kernel refused a next hop on during this call: a switch
            # whose links are going down refuses every route over them, and
            # learning that once per route cost a refusal and a link dump each
            # (a failed ToR's 16 routes took 0.2 s per link event).
            down: Set[int] = set()
            with self._locks[switch]:
                routes: List[Route] = []    # a run of routes, written together
                for intent in list(intents) + [None]:
                    if isinstance(intent, Route) and switch in self.writers:
                        routes.append(intent)
                        continue
                    if routes:
                        self._guarded(switch, routes[0],
                                      lambda: self._write_routes(switch, routes, down))
                        routes = []
                    if intent is not None:
                        self._guarded(switch, intent,
                                      lambda: self._apply_one(switch, intent, down, written))
        if not written:
            return None
        return min(before for before, _ in written), max(after for _, after in written)

    def _guarded(self, switch: str, intent: Intent, apply) -> None:
        """Run ``apply``; any error becomes a NetlinkError naming the switch and
        the intent (kept in ``errors``)."""
        try:
            apply()
        except NetlinkError:
            raise
        except Exception as exc:   # pyroute2's NetlinkError, OSError...
            message = f"{switch}: {intent}: {type(exc).__name__}: {exc}"
            self.errors.append(message)
            raise NetlinkError(message) from exc

    def _write_routes(self, switch: str, routes: List[Route], down: Set[int]) -> None:
        """Several destination routes through the switch's `RouteWriter`, a write
        at a time.  Routes the kernel refused because a port just went down
        (ENETDOWN) are written again without the ports found down, which are
        looked up once per refused write, as `_replace_route` does per route;
        any other refusal is an error."""
        pending = list(routes)
        for _ in range(WRITE_ROUNDS):
            specs = [self._route_spec(switch, route.dst_ip,
                                      tuple(port for port in route.ports if port not in down))
                     for route in pending]
            codes = self.writers[switch].replace(specs)
            for route, code in zip(pending, codes):
                if code and code != ENETDOWN:
                    raise NetlinkError(f"{switch}: {route}: the kernel refused it: "
                                       f"{os.strerror(code)}")
            pending = [route for route, code in zip(pending, codes) if code == ENETDOWN]
            if not pending:
                return
            up = self._ports_up(switch, self.sockets[switch])
            down.update(port for port, is_up in up.items() if not is_up)
            LOG.info("%s: %d route(s) refused, port(s) %s down in the kernel", switch,
                     len(pending), sorted(down))
        for route in pending:       # ports still going down as we write: one at a time
            self._replace_route(switch, self.sockets[switch], route.dst_ip, route.ports, down)

    def sync(self) -> None:
        """Nothing to wait for: a netlink acknowledgement means the kernel applied it."""

    def _apply_one(self, switch: str, intent: Intent, down: Set[int],
                   written: List[Tuple[float, float]]) -> None:
        sock = self.sockets[switch]
        if isinstance(intent, Resync) and getattr(self.patches.get(switch), "taken_over",
                                                  False):
            # A panel taken over in place: its lit entries stay, the Lightpaths
            # after this rewrite them, and the ports that must be dark go dark.
            patch = self.patches[switch]
            for port in intent.dark_ports:
                written.append(patch.dark(self.indexes[switch][port], PATCH_PRIO))
        elif isinstance(intent, (Reset, Resync)):
            if self.fabric.kind(switch) == OCS:
                self._reset_patch_panel(switch, sock)
            else:
                self._reset_router(switch, sock, keep_routes=isinstance(intent, Resync))
        elif isinstance(intent, Route):
            self._replace_route(switch, sock, intent.dst_ip, intent.ports, down)
        elif isinstance(intent, Lightpath):
            patch = self.patches.get(switch)
            for port, peer in ((intent.a, intent.b), (intent.b, intent.a)):
                index = self.indexes[switch][port]
                if patch is not None:
                    if intent.lit:
                        written.append(patch.light(index, self.indexes[switch][peer],
                                                   PATCH_PRIO))
                    else:
                        written.append(patch.dark(index, PATCH_PRIO))
                elif intent.lit:
                    sock.tc("add-filter", "u32", index, parent=INGRESS_PARENT,
                            protocol=ETH_P_ALL, prio=PATCH_PRIO, target=PATCH_CLASS,
                            keys=["0x0/0x0+0"],
                            action={"kind": "mirred", "direction": "egress",
                                    "action": "redirect",
                                    "ifindex": self.indexes[switch][peer]})
                else:
                    sock.tc("del-filter", "u32", index, parent=INGRESS_PARENT,
                            protocol=ETH_P_ALL, prio=PATCH_PRIO, target=PATCH_CLASS)
        elif isinstance(intent, PinHop):
            table = pin_table(intent.serial)
            if self._replace_route(switch, sock, intent.dst_ip, (intent.port,), down,
                                   table=table):
                sock.rule("add", **self._pin_rule(intent.src_ip, intent.dst_ip, table))
        elif isinstance(intent, UnpinHop):
            table = pin_table(intent.serial)
            sock.rule("del", **self._pin_rule(intent.src_ip, intent.dst_ip, table))
            try:
                sock.route("del", dst=f"{intent.dst_ip}/32", table=table)
            except Exception as exc:
                # The kernel deletes a route whose only port went down: a pin
                # dropped by a link failure may have lost its route already.
                if getattr(exc, "code", None) != ESRCH:
                    raise
        else:
            raise NetlinkError(f"not an intent: {intent!r}")

    def _replace_route(self, switch: str, sock, dst_ip: str, ports, down: Set[int],
                       **extra) -> bool:
        """Install a route; returns whether any of its ports could carry it.

        The kernel refuses a next hop on an interface that is down (ENETDOWN).
        A link that went down an instant ago may not have reached the
        controller's link state yet (its event is still queued behind the one
        being handled), so the route is installed over the ports that are up;
        the pending event then reroutes as usual.  With no port up, a
        destination route becomes a blackhole and a pin is not installed (its
        pair keeps its destination route).  ``down`` holds the ports found
        down earlier in the same batch, left out from the start, and learns
        the ones found now.
        """
        alive = tuple(port for port in ports if port not in down)
        # Each refusal means one more port went down since the last look (a
        # switch failing takes its links down one after another), so this ends.
        for _ in range(len(alive) + 2):
            if not alive and extra:
                return False
            try:
                sock.route("replace", **self._route(switch, dst_ip, alive), **extra)
                return bool(alive)
            except Exception as exc:
                if getattr(exc, "code", None) != ENETDOWN:
                    raise
            up = self._ports_up(switch, sock)
            down.update(port for port, is_up in up.items() if not is_up)
            alive = tuple(port for port in ports if up.get(port))
            LOG.info("%s: route to %s: port(s) %s down in the kernel, using %s", switch,
                     dst_ip, sorted(set(ports) - set(alive)), list(alive) or "none")
        raise NetlinkError(f"{switch}: route to {dst_ip}: its ports keep going down")

    def _ports_up(self, switch: str, sock) -> Dict[int, bool]:
        flags = {link["index"]: link["flags"] for link in sock.get_links()}
        up = IFF_UP | IFF_LOWER_UP
        return {port: flags.get(index, 0) & up == up
                for port, index in self.indexes[switch].items()}

    # ------------------------------------------------------------ translation
    def _peer_is_host(self, switch: str, port: int) -> Optional[str]:
        peer, _ = self.fabric.peer(switch, port)
        return peer if self.fabric.kind(peer) == HOST else None

    def _route(self, switch: str, dst_ip: str, ports) -> dict:
        """A route to one host: its next hops, one per port (sorted), or a blackhole."""
        spec = {"dst": f"{dst_ip}/32", "proto": PROTO_FABRIC}
        if not ports:
            return dict(spec, type="blackhole")
        hops = []
        for port in sorted(ports):
            index = self.indexes[switch][port]
            if self._peer_is_host(switch, port):
                hops.append({"oif": index})
            else:
                hops.append({"gateway": GATEWAY, "oif": index, "flags": RTNH_F_ONLINK})
        if len(hops) == 1:
            return dict(spec, **hops[0])
        return dict(spec, multipath=hops)

    def _route_spec(self, switch: str, dst_ip: str, ports) -> RouteSpec:
        """`_route` for the `RouteWriter`: the same next hops."""
        hops = tuple(NextHop(self.indexes[switch][port],
                             None if self._peer_is_host(switch, port) else GATEWAY)
                     for port in sorted(ports))
        return RouteSpec(dst_ip, hops, MAIN_TABLE, PROTO_FABRIC)

    @staticmethod
    def _pin_rule(src_ip: str, dst_ip: str, table: int) -> dict:
        return {"table": table, "priority": table, "src": src_ip, "src_len": 32,
                "dst": dst_ip, "dst_len": 32}

    def _reset_router(self, switch: str, sock, keep_routes: bool = False) -> None:
        # A resync keeps the routes: every destination has one (a blackhole
        # when unreachable), and the Routes after it replace each in place.
        for route in [] if keep_routes else sock.get_routes(table=MAIN_TABLE):
            if route["proto"] == PROTO_FABRIC:
                sock.route("del", dst=f"{route.get_attr('RTA_DST')}/{route['dst_len']}",
                           table=MAIN_TABLE, type=route["type"])
        for rule in sock.get_rules():
            table = rule.get_attr("FRA_TABLE") or rule["table"]
            if PIN_TABLE_BASE <= table < PIN_TABLE_BASE + PIN_TABLES:
                sock.rule("del", table=table, priority=rule.get_attr("FRA_PRIORITY"))
                sock.flush_routes(table=table)
        for port in sorted(self.indexes[switch]):
            self._install_neighbour(switch, sock, port)

    def _install_neighbour(self, switch: str, sock, port: int) -> None:
        index = self.indexes[switch][port]
        host = self._peer_is_host(switch, port)
        if host is not None:
            data = self.fabric.graph.nodes[host]
            sock.neigh("replace", dst=data["ip"], lladdr=data["mac"], ifindex=index,
                       state=NUD_PERMANENT)
        else:
            sock.neigh("replace", dst=GATEWAY, lladdr=ROUTER_MAC, ifindex=index,
                       state=NUD_PERMANENT)

    def port_up(self, switch: str, port: int) -> None:
        """A port came back: put its static neighbour back.

        Taking an interface down (a failure, `Testbed.change_links`) flushes its
        neighbour entries, permanent ones included, so a restored link would
        otherwise route into "host unreachable".  Call this before rerouting
        onto the port.
        """
        if self.fabric.kind(switch) == OCS:
            return
        with self._locks[switch]:
            self._install_neighbour(switch, self.sockets[switch], port)

    def _reset_patch_panel(self, switch: str, sock) -> None:
        for port, index in sorted(self.indexes[switch].items()):
            qdiscs = [q for q in sock.get_qdiscs(index) if q.get_attr("TCA_KIND") == "ingress"]
            if qdiscs:
                sock.tc("del", "ingress", index)
            sock.tc("add", "ingress", index)
        patch = self.patches.get(switch)
        if getattr(patch, "kernel_timed", False):
            patch.attach_ports(sorted(self.indexes[switch].values()))

    # ------------------------------------------------------------ kernel-timed circuits
    def kernel_timed(self, ocs: str) -> bool:
        """Whether this OCS's circuits are timed by the kernel (the BPF panel)."""
        return getattr(self.patches.get(ocs), "kernel_timed", False)

    def panel(self) -> dict:
        """Which patch panel each OCS runs: ``{ocs: "bpf" | "mirred" | "pyroute2"}``."""
        return {ocs: getattr(self.patches.get(ocs), "kind", "mirred" if ocs in self.patches
                             else "pyroute2")
                for ocs in sorted(self.indexes) if self.fabric.kind(ocs) == OCS}

    def timed_circuits(self, ocs: str, tear: List[Lightpath], light: List[Lightpath],
                       delay_s: float, lead_s: Optional[float] = None
                       ) -> Tuple[float, float, Tuple[float, float]]:
        """A reconfiguration as one write of the OCS's map, anchored by the
        kernel (`BpfPatchPanel.timed`): the torn circuits go dark ``lead_s``
        after the anchor, the new ones light ``delay_s`` after that.  Returns
        (dark from, lit at) in epoch seconds, as the kernel holds them, and
        the epoch times around the write and anchoring."""
        from controllers.netlink.bpfpanel import DEFAULT_LEAD_S

        patch = self.patches[ocs]
        lead_s = DEFAULT_LEAD_S if lead_s is None else lead_s
        index = self.indexes[ocs]
        dark_at = int(round(lead_s * 1e9))               # from the anchor
        lit_at = dark_at + int(round(delay_s * 1e9))
        peer_now: Dict[int, int] = {}
        peer_next: Dict[int, int] = {}
        for intents, peers in ((tear, peer_now), (light, peer_next)):
            for path in intents:
                peers[index[path.a]] = index[path.b]
                peers[index[path.b]] = index[path.a]
        changes = {port: circuits_in_kernel.arming(
                       peer_now.get(port, 0), dark_at if port in peer_now else 0,
                       peer_next.get(port, 0),
                       lit_at if port in peer_next else circuits_in_kernel.FOREVER)
                   for port in set(peer_now) | set(peer_next)}
        with self._locks[ocs]:
            before = time.time()
            anchor = patch.timed(changes)
            written = (before, time.time())
        return patch.clock.to_epoch(anchor + dark_at), patch.clock.to_epoch(anchor + lit_at), \
            written

    def set_schedule(self, ocs_entries: Dict[str, Dict[int, object]],
                     tor_entries: Dict[str, Dict[int, object]]) -> Tuple[float, float]:
        """Write cyclic entries (`controllers.schedule`) into each OCS's map and
        each ToR's time-flow table; the epoch times around the OCS writes."""
        for ocs in ocs_entries:
            if not self.kernel_timed(ocs):
                raise NetlinkError(f"{ocs}: schedules need the BPF patch panel "
                                   f"(this OCS runs the {self.panel().get(ocs)} one)")
        for tor in tor_entries:
            if tor not in self.tables:
                if tor not in self.timeflows:
                    raise NetlinkError(f"{tor}: no time-flow table for this switch")
                self.tables[tor] = self._open_timeflow(tor)
            self.tables[tor].write(tor_entries[tor])
        windows = []
        for ocs, changes in ocs_entries.items():
            with self._locks[ocs]:
                windows.append(self.patches[ocs].schedule(changes))
        if not windows:
            now = time.time()
            return now, now
        return min(w[0] for w in windows), max(w[1] for w in windows)

    def clear_schedule(self) -> None:
        """ToRs route by their kernel tables again (their maps emptied)."""
        for table in self.tables.values():
            table.write({})

    def _open_timeflow(self, tor: str):
        """The ToR's time-flow programs on its ports: host ports look up the
        slot's uplink, uplinks drop frames meant for other ToRs."""
        from controllers.netlink.bpfpanel import HOST_PORT_PROGRAM, UPLINK_PROGRAM

        sock = self.sockets[tor]
        table = self.timeflows[tor]()
        hosts, uplinks = [], []
        for port, index in sorted(self.indexes[tor].items()):
            qdiscs = [q for q in sock.get_qdiscs(index) if q.get_attr("TCA_KIND") == "ingress"]
            if not qdiscs:
                sock.tc("add", "ingress", index)
            (hosts if self._peer_is_host(tor, port) else uplinks).append(index)
        table.attach(hosts, HOST_PORT_PROGRAM)
        table.attach(uplinks, UPLINK_PROGRAM)
        return table

    # ------------------------------------------------------------ queries
    def status(self) -> dict:
        return {"connected": sorted(self.sockets), "ready_switches": sorted(self.ready),
                "errors": list(self.errors), "panel": self.panel(),
                "panel_note": self.panel_note}

    def counters(self) -> Dict[str, Dict[int, dict]]:
        """Every attached switch's port counters, from the kernel's link statistics.

        Safe beside `apply` on another thread, and never in its way: it takes
        none of the switches' locks, and reads each namespace through its stats
        socket.  A switch attached without one is read through its route
        socket, whose calls the netlink thread runs one at a time
        (`controllers.netlink.namespaces.ThreadBoundSocket`).
        """
        result: Dict[str, Dict[int, dict]] = {}
        # A copy: `attach` may add a switch meanwhile (its ports come last).
        for switch, indexes in sorted(list(self.indexes.items())):
            stats, sock = self.stats.get(switch), self.sockets.get(switch)
            if stats is not None:
                by_index = stats.by_index()
            elif sock is not None:
                by_index = {link["index"]: link.get_attr("IFLA_STATS64") or {}
                            for link in sock.get_links()}
            else:
                continue            # closed
            result[switch] = {
                port: {key: int(by_index.get(index, {}).get(key, 0)) for key in (
                    "rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_dropped",
                    "tx_dropped")}
                for port, index in sorted(indexes.items())}
        return result

    def path(self, src: str, dst: str, sport: int, dport: int,
             proto: int = 6) -> Optional[List[str]]:
        """The nodes a packet of one flow crosses now, as each router's kernel picks
        its next hop for the flow's five-tuple (and each OCS its lit circuit);
        None where a hop cannot tell: a host with several NICs (its own kernel
        picks one), a host that forwards, a dark port."""
        hops = self.hops(src, dst, sport, dport, proto)
        return None if hops is None else [node for node, _ in hops]

    def hops(self, src: str, dst: str, sport: int, dport: int,
             proto: int = 6) -> Optional[List[Tuple[str, Optional[int]]]]:
        """`path` with the port each node sends the flow out of ((dst, None) last):
        of two parallel links between the same switches, the one it takes."""
        fabric = self.fabric
        if len(fabric.graph.edges(src)) != 1:
            return None
        src_ip, dst_ip = (fabric.graph.nodes[h]["ip"] for h in (src, dst))
        node, in_port = fabric.host_port(src)
        hops: List[Tuple[str, Optional[int]]] = [(src, next(iter(fabric.ports_of(src))))]
        for _ in range(MAX_HOPS):
            if fabric.kind(node) == OCS:
                out = next((b if a == in_port else a for a, b in fabric.circuits.get(node, ())
                            if in_port in (a, b)), None)
            else:
                lookup = self.lookups.get(node)
                if lookup is None:
                    return None
                try:
                    oif = lookup.output(dst_ip, src_ip, self.indexes[node][in_port], sport,
                                        dport, proto)
                except OSError:
                    return None
                out = next((p for p, i in self.indexes[node].items() if i == oif), None)
            if out is None:
                return None
            hops.append((node, out))
            peer, peer_port = fabric.peer(node, out)
            if fabric.kind(peer) == HOST:
                return hops + [(peer, None)] if peer == dst else None
            node, in_port = peer, peer_port
        return None

    def close(self) -> None:
        for sock in list(self.sockets.values()) + list(self.patches.values()) + \
                list(self.lookups.values()) + list(self.writers.values()) + \
                list(self.stats.values()) + list(self.tables.values()):
            try:
                sock.close()
            except Exception:      # closing on the way out: nothing left to protect
                pass
        self.sockets.clear()
        self.patches.clear()
        self.lookups.clear()
        self.writers.clear()
        self.stats.clear()
        self.tables.clear()

