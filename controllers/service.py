"""Controller state shared by the os-ken shim and the control channel.

``FabricService`` owns the EPS and OCS cores, the connected datapaths and the
barrier bookkeeping.  It never imports os-ken's app machinery, so unit tests
drive it with fake datapaths that serialise real OpenFlow 1.3 messages.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Set

from controllers import ofmsg
from controllers.eps_core import EpsCore
from controllers.ocs_core import TECHNOLOGIES, OcsCore
from controllers.pins import PinTable
from controllers.reconfig import reconfigure
from topologies.fabric import EPS, HOST, OCS, Fabric, FabricError

LOG = logging.getLogger("fabric.service")
BARRIER_TIMEOUT_S = 10.0
LEAD_HISTORY = 5


class SwitchError(RuntimeError):
    """A switch rejected a message or did not confirm a barrier."""


class FabricService:
    def __init__(self, fabric: Fabric, tdf: float = 1.0,
                 dataplane_sync: Optional[Callable[[], None]] = None):
        self.fabric = fabric
        self.dataplane_sync = dataplane_sync
        self.tdf = tdf
        self.eps = EpsCore(fabric)
        self.pins = PinTable(fabric)
        self.dropped_pins: Set[str] = set()
        self.ocs: Dict[str, OcsCore] = {name: OcsCore(fabric, name, tdf)
                                         for name in fabric.ocs_switches}
        self.datapaths: Dict[str, object] = {}
        self.ready: Set[str] = set()
        self.errors: List[str] = []
        self.down_ports: Set[tuple] = set()         # (switch, port) reported down
        self.manual_down: Set[frozenset] = set()    # links failed through `do_link`
        self._pending: Dict[tuple, threading.Event] = {}
        self._initial: Dict[tuple, str] = {}
        self._state_lock = threading.Lock()
        self._reconfig_lock = threading.Lock()

    # ------------------------------------------------------------ datapath events
    def switch_connected(self, datapath) -> None:
        name = self.fabric.node_by_dpid(datapath.id)
        kind = self.fabric.kind(name)
        msgs = self.eps.switch_start(name) + self.pins.switch_start(name) if kind == EPS \
            else self.ocs[name].switch_start()
        with self._state_lock:
            self.datapaths[name] = datapath
            self.ready.discard(name)
        self._send(datapath, msgs, initial=name)
        LOG.info("%s (dpid %d) connected: %d messages installed", name, datapath.id, len(msgs))

    def switch_disconnected(self, datapath) -> None:
        with self._state_lock:
            for name, known in list(self.datapaths.items()):
                if known is datapath:
                    del self.datapaths[name]
                    self.ready.discard(name)

    def barrier_replied(self, datapath, xid: int) -> None:
        with self._state_lock:
            event = self._pending.pop((datapath.id, xid), None)
            name = self._initial.pop((datapath.id, xid), None)
            if name is not None:
                self.ready.add(name)
        if event is not None:
            event.set()

    def error_received(self, datapath, description: str) -> None:
        message = f"dpid {datapath.id}: {description}"
        LOG.error("switch error: %s", message)
        with self._state_lock:
            self.errors.append(message)

    # ------------------------------------------------------------ sending
    def _send(self, datapath, msgs: List, initial: Optional[str] = None) -> int:
        """Send msgs and a barrier; returns the barrier's xid.

        The barrier is registered before anything is sent, so a reply that
        comes back at once is never missed; ``initial`` names a switch that
        becomes ready when this barrier is answered.
        """
        barrier = ofmsg.barrier()
        barrier.datapath = datapath
        xid = datapath.set_xid(barrier)
        with self._state_lock:
            self._pending[(datapath.id, xid)] = threading.Event()
            if initial is not None:
                self._initial[(datapath.id, xid)] = initial
        for msg in msgs:
            msg.datapath = datapath
            datapath.send_msg(msg)
        datapath.send_msg(barrier)
        return xid

    def apply(self, batch: Dict[str, List]) -> None:
        """Send each switch its messages, then wait for every barrier reply."""
        errors_before = len(self.errors)
        waits = []
        for name, msgs in batch.items():
            datapath = self.datapaths.get(name)
            if datapath is None:
                raise SwitchError(f"{name} is not connected")
            xid = self._send(datapath, msgs)
            waits.append((name, self._pending.get((datapath.id, xid))))
        deadline = time.time() + BARRIER_TIMEOUT_S
        for name, event in waits:
            if event is not None and not event.wait(max(0.0, deadline - time.time())):
                with self._state_lock:
                    for key, pending in list(self._pending.items()):
                        if pending is event:
                            del self._pending[key]
                raise SwitchError(f"{name} did not answer a barrier within {BARRIER_TIMEOUT_S} s")
        if len(self.errors) > errors_before:
            raise SwitchError("switch errors: " + "; ".join(self.errors[errors_before:]))

    # ------------------------------------------------------------ control requests
    def status(self) -> dict:
        switches = set(self.fabric.switches)
        with self._state_lock:
            return {"ready": self.ready >= switches and not self.errors,
                    "connected": sorted(self.datapaths), "ready_switches": sorted(self.ready),
                    "missing": sorted(switches - self.ready), "errors": list(self.errors)}

    def state(self) -> dict:
        return {"circuits": {o: sorted(list(c) for c in cs)
                             for o, cs in self.fabric.circuits.items()},
                "technology": {o: {"name": core.technology,
                                   "delay_ms": self.fabric.graph.nodes[o].get("delay_ms")}
                               for o, core in self.ocs.items()},
                "down_links": sorted(sorted(link) for link in self.eps.down_links),
                "pins": self.pins.state(),
                "tdf": self.tdf}

    def _ocs(self, name) -> OcsCore:
        if name not in self.ocs:
            raise FabricError(f"unknown OCS {name!r}; OCS in this fabric: {sorted(self.ocs)}")
        return self.ocs[name]

    def do_reconfigure(self, ocs: str, circuits, delay_ms: Optional[float] = None,
                       technology: Optional[str] = None) -> dict:
        core = self._ocs(ocs)
        with self._reconfig_lock:
            # Check the circuits before changing the technology: a refusal changes nothing.
            circuits = self.fabric.check_circuits(ocs, circuits)
            if technology is not None:
                core.set_technology(technology, delay_ms)
            plan = core.plan(circuits, delay_ms)
            result = reconfigure(self.eps, core, plan, self.apply, sync=self.dataplane_sync,
                                 light_lead_s=self.light_lead_s())
        core.history.append(result)
        LOG.info("%s reconfigured: tear %s light %s dark %.3f ms", ocs, sorted(plan.tear),
                 sorted(plan.light), result["dark_s"] * 1000)
        return result

    def light_lead_s(self) -> float:
        """Half the median lighting round of the last reconfigurations (any OCS)."""
        latencies = sorted(r["light_latency_s"] for core in self.ocs.values()
                           for r in core.history[-LEAD_HISTORY:] if r["plan"]["light"])
        return latencies[len(latencies) // 2] / 2 if latencies else 0.0

    def do_preset(self, ocs: str, technology: str, delay_ms: Optional[float] = None) -> dict:
        real_ms = self._ocs(ocs).set_technology(technology, delay_ms)
        return {"ocs": ocs, "technology": technology, "delay_real_ms": real_ms,
                "delay_emulated_ms": real_ms * self.tdf}

    def do_link(self, u: str, v: str, up: bool) -> dict:
        """The control channel's ``link`` op: fail or restore a link by hand.

        A link failed by hand stays down whatever its ports report; one
        restored by hand comes back only if its ports are up.
        """
        if not self.fabric.graph.has_edge(u, v):
            raise FabricError(f"no link {u}-{v} in the fabric")
        link = frozenset((u, v))
        (self.manual_down.discard if up else self.manual_down.add)(link)
        return self._change_link(u, v, up and not self._ports_down(u, v))

    def _ports_down(self, a: str, b: str) -> bool:
        """Whether a switch port of a link between a and b reports down."""
        ends = {(node, data["ports"][node]) for _, _, data in
                self.fabric.graph.edges(a, data=True) if b in data["ports"]
                for node in (a, b) if self.fabric.kind(node) != HOST}
        return bool(ends & self.down_ports)

    def _change_link(self, u: str, v: str, up: bool) -> dict:
        with self._reconfig_lock:
            link = frozenset((u, v))
            (self.eps.down_links.discard if up else self.eps.down_links.add)(link)
            batch = self.eps.reroute()
            dropped = [] if up else self.pins.crossing([link])
            for pin_id in dropped:
                # A pinned pair over a dead link falls back to its destination route.
                for switch, msgs in self.pins.unpin(pin_id).items():
                    batch.setdefault(switch, []).extend(msgs)
                self.dropped_pins.add(pin_id)
            self.apply(batch)
        return {"changed_switches": sorted(batch), "dropped_pins": dropped}

    def do_pin(self, id: str, path: list) -> dict:
        """Pin one host pair's packets onto ``path`` (a reserved fast lane)."""
        with self._reconfig_lock:
            batch = self.pins.pin(id, path, down_links=self.eps.down_links)
            try:
                self.apply(batch)
            except Exception:
                self.pins.pins.pop(id, None)
                raise
        return {"pin": id, "switches": sorted(batch)}

    def do_unpin(self, id: str) -> dict:
        """Remove a pin; one already dropped by a link failure (`do_link`) is
        not an error, since its owner cannot know."""
        with self._reconfig_lock:
            if id in self.dropped_pins:
                self.dropped_pins.discard(id)
                return {"unpin": id, "switches": [], "dropped_by_failure": True}
            batch = self.pins.unpin(id)
            self.apply(batch)
        return {"unpin": id, "switches": sorted(batch)}

    def port_changed(self, datapath, port_no: int, up: bool) -> Optional[dict]:
        """A switch reported a port's link going down or up (OFPPortStatus).

        A link counts as down while either of its switch ports reports down
        (the two ends of a veth pair report separately and in any order, and
        an end still reporting up must not revive a link whose other end is
        down), or while it is failed by hand (`do_link`).  A change of a
        link's state reroutes as `do_link` does; other
        reports return None.  Ports the fabric does not wire (OVS's LOCAL
        port) are ignored.
        """
        name = self.fabric.node_by_dpid(datapath.id)
        wired = self.fabric.ports_of(name)
        if port_no not in wired:
            return None
        peer = wired[port_no][0]
        link = frozenset((name, peer))
        with self._reconfig_lock:
            (self.down_ports.discard if up else self.down_ports.add)((name, port_no))
            link_up = not self._ports_down(name, peer) and link not in self.manual_down
            if (link not in self.eps.down_links) == link_up:
                return None
        LOG.info("link %s-%s went %s (port %d of %s reported)", name, peer,
                 "up" if link_up else "down", port_no, name)
        return self._change_link(name, peer, link_up)

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        args = {k: v for k, v in request.items() if k != "op"}
        if op == "status":
            return self.status()
        if op == "state":
            return self.state()
        if op == "reconfigure":
            return self.do_reconfigure(**args)
        if op == "preset":
            return self.do_preset(**args)
        if op == "link":
            return self.do_link(**args)
        if op == "pin":
            return self.do_pin(**args)
        if op == "unpin":
            return self.do_unpin(**args)
        if op == "technologies":
            return {"technologies": {k: vars(t) for k, t in TECHNOLOGIES.items()}}
        raise ValueError(f"unknown op {op!r}; allowed: status, state, reconfigure, preset, "
                         "link, pin, unpin, technologies")


__all__ = ["FabricService", "SwitchError", "OCS"]
