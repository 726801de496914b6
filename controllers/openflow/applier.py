"""The OpenFlow applier: intents to Open vSwitch, each batch confirmed by barriers.

`OpenFlowApplier` knows the connected datapaths and the barrier bookkeeping;
it turns a batch of intents (`controllers.intents`) into OpenFlow 1.3
messages (`controllers.openflow.messages`), sends every switch its messages
and a barrier, and returns once every barrier is answered.  It never decides
anything: the cores did (`controllers.service.FabricService` asks them).  It
never imports os-ken's app machinery either, so unit tests drive it with
fake datapaths that serialise real OpenFlow 1.3 bytes (``tests/unit/fakes.py``).

A barrier reply says that ovs-vswitchd's OpenFlow tables changed, not its
datapath's cached flows; ``sync`` (`controllers.openflow.ovs_sync`) flushes
that cache where the controller runs beside Open vSwitch.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Set

from controllers.intents import Batch, Intent
from controllers.openflow import messages
from topologies.fabric import OCS, Fabric

LOG = logging.getLogger("fabric.openflow")
BARRIER_TIMEOUT_S = 10.0
STATS_TIMEOUT_S = 10.0


class SwitchError(RuntimeError):
    """A switch rejected a message, did not confirm a barrier or is not connected."""


class OpenFlowApplier:
    """Applies intents to the connected Open vSwitch bridges of one fabric."""

    def __init__(self, fabric: Fabric, dataplane_sync: Optional[Callable[[], None]] = None):
        self.fabric = fabric
        self.dataplane_sync = dataplane_sync
        self.datapaths: Dict[str, object] = {}
        self.ready: Set[str] = set()
        self.errors: List[str] = []
        self._pending: Dict[tuple, threading.Event] = {}
        self._initial: Dict[tuple, str] = {}
        self._stats: Dict[tuple, dict] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ translation
    def messages(self, switch: str, intents: List[Intent]) -> List:
        return messages.to_messages(intents, self._group_of, self.fabric.kind(switch) == OCS)

    def _group_of(self, host: str) -> int:
        return self.fabric.graph.nodes[host]["index"]

    # ------------------------------------------------------------ datapath events
    def name_of(self, datapath) -> str:
        return self.fabric.node_by_dpid(datapath.id)

    def switch_connected(self, datapath, intents: List[Intent]) -> None:
        """A switch (re)connected: bring it to ``intents`` (a Reset first); it counts
        as ready once the barrier after them is answered."""
        name = self.name_of(datapath)
        msgs = self.messages(name, intents)
        with self._lock:
            self.datapaths[name] = datapath
            self.ready.discard(name)
        self._send(datapath, msgs, initial=name)
        LOG.info("%s (dpid %d) connected: %d messages installed", name, datapath.id, len(msgs))

    def switch_disconnected(self, datapath) -> None:
        with self._lock:
            for name, known in list(self.datapaths.items()):
                if known is datapath:
                    del self.datapaths[name]
                    self.ready.discard(name)

    def barrier_replied(self, datapath, xid: int) -> None:
        with self._lock:
            event = self._pending.pop((datapath.id, xid), None)
            name = self._initial.pop((datapath.id, xid), None)
            if name is not None:
                self.ready.add(name)
        if event is not None:
            event.set()

    def error_received(self, datapath, description: str) -> None:
        message = f"dpid {datapath.id}: {description}"
        LOG.error("switch error: %s", message)
        with self._lock:
            self.errors.append(message)

    def port_stats_replied(self, datapath, xid: int, body, more: bool) -> None:
        """A (part of a) port-stats reply: counters per port, the request done when
        the last part arrives."""
        with self._lock:
            entry = self._stats.get((datapath.id, xid))
            if entry is None:
                return
            for stat in body:
                entry["ports"][stat.port_no] = {
                    "rx_bytes": stat.rx_bytes, "tx_bytes": stat.tx_bytes,
                    "rx_packets": stat.rx_packets, "tx_packets": stat.tx_packets,
                    "rx_dropped": stat.rx_dropped, "tx_dropped": stat.tx_dropped}
            if not more:
                entry["done"].set()

    # ------------------------------------------------------------ sending
    def _send(self, datapath, msgs: List, initial: Optional[str] = None) -> int:
        """Send msgs and a barrier; returns the barrier's xid.

        The barrier is registered before anything is sent, so a reply that
        comes back at once is never missed; ``initial`` names a switch that
        becomes ready when this barrier is answered.
        """
        barrier = messages.barrier()
        barrier.datapath = datapath
        xid = datapath.set_xid(barrier)
        with self._lock:
            self._pending[(datapath.id, xid)] = threading.Event()
            if initial is not None:
                self._initial[(datapath.id, xid)] = initial
        for msg in msgs:
            msg.datapath = datapath
            datapath.send_msg(msg)
        datapath.send_msg(barrier)
        return xid

    def apply(self, batch: Batch) -> None:
        """Send each switch its intents' messages, then wait for every barrier reply."""
        errors_before = len(self.errors)
        waits = []
        for name, intents in batch.items():
            datapath = self.datapaths.get(name)
            if datapath is None:
                raise SwitchError(f"{name} is not connected")
            xid = self._send(datapath, self.messages(name, intents))
            waits.append((name, self._pending.get((datapath.id, xid))))
        deadline = time.time() + BARRIER_TIMEOUT_S
        for name, event in waits:
            if event is not None and not event.wait(max(0.0, deadline - time.time())):
                with self._lock:
                    for key, pending in list(self._pending.items()):
                        if pending is event:
                            del self._pending[key]
                raise SwitchError(f"{name} did not answer a barrier within {BARRIER_TIMEOUT_S} s")
        if len(self.errors) > errors_before:
            raise SwitchError("switch errors: " + "; ".join(self.errors[errors_before:]))

    def sync(self) -> None:
        """Confirm that the datapath itself applied the last batch (flush its cache)."""
        if self.dataplane_sync is not None:
            self.dataplane_sync()

    # ------------------------------------------------------------ queries
    def status(self) -> dict:
        with self._lock:
            return {"connected": sorted(self.datapaths), "ready_switches": sorted(self.ready),
                    "errors": list(self.errors)}

    def counters(self) -> Dict[str, Dict[int, dict]]:
        """Every connected switch's port counters (OpenFlow port stats), by switch
        and port; ports the fabric does not wire (OVS's LOCAL) are left out."""
        waits: List[tuple] = []
        for name, datapath in sorted(self.datapaths.items()):
            request = messages.port_stats_request()
            request.datapath = datapath
            xid = datapath.set_xid(request)
            entry = {"ports": {}, "done": threading.Event()}
            with self._lock:
                self._stats[(datapath.id, xid)] = entry
            datapath.send_msg(request)
            waits.append((name, (datapath.id, xid), entry))
        deadline = time.time() + STATS_TIMEOUT_S
        result: Dict[str, Dict[int, dict]] = {}
        try:
            for name, key, entry in waits:
                if not entry["done"].wait(max(0.0, deadline - time.time())):
                    raise SwitchError(f"{name} did not answer a port-stats request within "
                                      f"{STATS_TIMEOUT_S} s")
                wired = self.fabric.ports_of(name)
                result[name] = {port: counters for port, counters in entry["ports"].items()
                                if port in wired}
        finally:
            with self._lock:
                for _, key, _ in waits:
                    self._stats.pop(key, None)
        return result
