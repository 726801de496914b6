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

Who may connect: a datapath whose id is no switch of the fabric is refused
(`admit`: logged with its peer's address, kept in ``refused``, its connection
closed) and the controller goes on.  A second connection for a switch that
already has one takes over from it, loudly: logged with both peers, kept in
``takeovers`` and the old connection closed (see `switch_connected` for why
the newcomer wins).  Both lists reach the control channel's ``status``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Set

from controllers.intents import Batch, Intent
from controllers.openflow import messages
from topologies.fabric import OCS, Fabric, FabricError

LOG = logging.getLogger("fabric.openflow")
BARRIER_TIMEOUT_S = 10.0
STATS_TIMEOUT_S = 10.0
# Records kept of refused datapaths and of takeovers.  OVS retries a refused
# connection every few seconds for as long as the bridge lives, so a stranger
# is one record with a count, and the list is bounded either way: a run's
# status must not grow with the time a misconfigured bridge keeps trying.
RECORDS_KEPT = 32


class SwitchError(RuntimeError):
    """A switch rejected a message, did not confirm a barrier or is not connected."""


class _Answer(threading.Event):
    """The reply a barrier or a port-stats request waits for.  ``lost`` says why
    it will never come (its connection closed), so a waiter fails at once
    instead of at its timeout, and takes no lost connection for a confirmation."""

    lost: Optional[str] = None

    def abandon(self, why: str) -> None:
        self.lost = why
        self.set()


def peer_of(datapath) -> str:
    """``host:port`` of a datapath's connection (os-ken's ``address``), for logs."""
    address = getattr(datapath, "address", None)
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address) if address is not None else "unknown peer"


class OpenFlowApplier:
    """Applies intents to the connected Open vSwitch bridges of one fabric."""

    def __init__(self, fabric: Fabric, dataplane_sync: Optional[Callable[[], None]] = None):
        self.fabric = fabric
        self.dataplane_sync = dataplane_sync
        self.datapaths: Dict[str, object] = {}
        self.ready: Set[str] = set()
        self.errors: List[str] = []
        self.refused: List[dict] = []       # datapaths that are no switch of the fabric
        self.takeovers: List[dict] = []     # a switch's connection replaced by another
        # Keyed by (datapath object, xid), not dpid: an old and a new connection
        # of one switch share the dpid, and the old one's leftovers must not
        # answer, or be purged with, the new one's.
        self._pending: Dict[tuple, _Answer] = {}
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

    def admit(self, datapath, now: Optional[float] = None) -> Optional[str]:
        """The switch a connecting datapath is, or None once it was refused.

        A dpid the fabric does not have is a bridge of something else (or of
        another run) pointed at this controller: it is logged with its peer,
        recorded in ``refused`` and its connection closed.  Ending the
        controller for it, as an exception in the handler would, would let any
        local process that opens a connection stop a run."""
        try:
            return self.name_of(datapath)
        except FabricError:
            pass
        peer = peer_of(datapath)
        LOG.error("refused a datapath with dpid %s from %s: no switch of fabric %s has it",
                  datapath.id, peer, self.fabric.name)
        with self._lock:
            _remember(self.refused, {"dpid": datapath.id, "host": peer.rsplit(":", 1)[0]},
                      {"peer": peer}, now)
        _close(datapath)
        return None

    def current(self, datapath) -> Optional[str]:
        """The switch this datapath is the live connection of, or None (refused,
        or replaced by a newer connection): a message from it is stale."""
        with self._lock:
            for name, known in self.datapaths.items():
                if known is datapath:
                    return name
        return None

    def switch_connected(self, datapath, intents: List[Intent],
                         now: Optional[float] = None) -> None:
        """A switch (re)connected: bring it to ``intents`` (a Reset first); it counts
        as ready once the barrier after them is answered.

        If the switch still has a live connection, the newcomer takes over and
        the old connection is closed, with a warning naming both peers and a
        record in ``takeovers``.  The newcomer wins because Open vSwitch
        reconnects on its own after it decided a connection was dead (an echo
        timeout, a restarted vswitchd), and this side may not have noticed:
        os-ken sends no echo requests unless configured to, so a half-open old
        connection can look alive for ever, and refusing the newcomer while it
        does would leave the switch uncontrolled.  The newcomer is brought to
        the whole state from a Reset, so nothing of the old connection is
        relied on.  Two bridges with one dpid would take over from each other
        at every reconnection, which the records show.
        """
        name = self.name_of(datapath)
        msgs = self.messages(name, intents)
        with self._lock:
            old = self.datapaths.get(name)
            self.datapaths[name] = datapath
            self.ready.discard(name)
            if old is not None and old is not datapath:
                _remember(self.takeovers, {"switch": name, "dpid": datapath.id},
                          {"old_peer": peer_of(old), "new_peer": peer_of(datapath)}, now)
                self._forget(old, f"{name}'s connection was taken over")
        if old is not None and old is not datapath:
            LOG.warning("%s (dpid %d): a second connection from %s takes over from %s; "
                        "the old connection is closed", name, datapath.id,
                        peer_of(datapath), peer_of(old))
            _close(old)
        self._send(datapath, msgs, initial=name)
        LOG.info("%s (dpid %d) connected: %d messages installed", name, datapath.id, len(msgs))

    def switch_disconnected(self, datapath) -> None:
        """A connection ended.  Only the switch whose live connection it was is
        forgotten: after a takeover, the old connection's end leaves the new
        one alone."""
        with self._lock:
            for name, known in list(self.datapaths.items()):
                if known is datapath:
                    del self.datapaths[name]
                    self.ready.discard(name)
            self._forget(datapath, "disconnected")

    def _forget(self, datapath, why: str) -> None:
        """Drop what waits on ``datapath`` (under the lock): its barriers and stats
        requests fail now rather than at their timeout, and nothing of a gone
        connection stays in the maps."""
        for key in [k for k in self._pending if k[0] is datapath]:
            self._pending.pop(key).abandon(why)
        for key in [k for k in self._initial if k[0] is datapath]:
            del self._initial[key]
        for key in [k for k in self._stats if k[0] is datapath]:
            self._stats.pop(key)["done"].abandon(why)

    def barrier_replied(self, datapath, xid: int) -> None:
        with self._lock:
            event = self._pending.pop((datapath, xid), None)
            name = self._initial.pop((datapath, xid), None)
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
            entry = self._stats.get((datapath, xid))
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
    def _send(self, datapath, msgs: List, initial: Optional[str] = None) -> _Answer:
        """Send msgs and a barrier; returns what the barrier's reply sets.

        The barrier is registered before anything is sent, so a reply that
        comes back at once is never missed; ``initial`` names a switch that
        becomes ready when this barrier is answered.
        """
        barrier = messages.barrier()
        barrier.datapath = datapath
        xid = datapath.set_xid(barrier)
        answer = _Answer()
        with self._lock:
            self._pending[(datapath, xid)] = answer
            if initial is not None:
                self._initial[(datapath, xid)] = initial
        for msg in msgs:
            msg.datapath = datapath
            datapath.send_msg(msg)
        datapath.send_msg(barrier)
        return answer

    def apply(self, batch: Batch) -> None:
        """Send each switch its intents' messages, then wait for every barrier reply."""
        errors_before = len(self.errors)
        waits = []
        for name, intents in batch.items():
            datapath = self.datapaths.get(name)
            if datapath is None:
                raise SwitchError(f"{name} is not connected")
            waits.append((name, self._send(datapath, self.messages(name, intents))))
        deadline = time.time() + BARRIER_TIMEOUT_S
        for name, answer in waits:
            if not answer.wait(max(0.0, deadline - time.time())):
                with self._lock:
                    for key, pending in list(self._pending.items()):
                        if pending is answer:
                            del self._pending[key]
                raise SwitchError(f"{name} did not answer a barrier within {BARRIER_TIMEOUT_S} s")
            if answer.lost:
                raise SwitchError(f"{name} did not confirm a batch: {answer.lost} first")
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
                    "errors": list(self.errors),
                    "refused": [dict(r) for r in self.refused],
                    "takeovers": [dict(t) for t in self.takeovers]}

    def counters(self) -> Dict[str, Dict[int, dict]]:
        """Every connected switch's port counters (OpenFlow port stats), by switch
        and port; ports the fabric does not wire (OVS's LOCAL) are left out."""
        waits: List[tuple] = []
        for name, datapath in sorted(self.datapaths.items()):
            request = messages.port_stats_request()
            request.datapath = datapath
            xid = datapath.set_xid(request)
            entry = {"ports": {}, "done": _Answer()}
            with self._lock:
                self._stats[(datapath, xid)] = entry
            datapath.send_msg(request)
            waits.append((name, (datapath, xid), entry))
        deadline = time.time() + STATS_TIMEOUT_S
        result: Dict[str, Dict[int, dict]] = {}
        try:
            for name, key, entry in waits:
                if not entry["done"].wait(max(0.0, deadline - time.time())):
                    raise SwitchError(f"{name} did not answer a port-stats request within "
                                      f"{STATS_TIMEOUT_S} s")
                if entry["done"].lost:
                    raise SwitchError(f"{name} did not answer a port-stats request: "
                                      f"{entry['done'].lost} first")
                wired = self.fabric.ports_of(name)
                result[name] = {port: counters for port, counters in entry["ports"].items()
                                if port in wired}
        finally:
            with self._lock:
                for _, key, _ in waits:
                    self._stats.pop(key, None)
        return result


def _remember(records: List[dict], key: dict, latest: dict, now: Optional[float]) -> None:
    """Count one more of ``key`` in a bounded record list (a stranger that retries,
    a switch taken over again, stays one record), with ``latest``'s details of
    the last time; a new key pushes the oldest record out past `RECORDS_KEPT`."""
    stamp = time.time() if now is None else now
    for record in records:
        if all(record.get(k) == v for k, v in key.items()):
            record.update(latest, times=record["times"] + 1, last=stamp)
            return
    records.append({**key, **latest, "times": 1, "first": stamp, "last": stamp})
    del records[:-RECORDS_KEPT]


def _close(datapath) -> None:
    """Close a datapath's connection; os-ken's ``close`` marks it dead (its
    state-change event follows) and shuts the socket for writing, so the switch
    sees the end and the receive loop returns."""
    close = getattr(datapath, "close", None)
    if close is None:
        return
    try:
        close()
    except OSError as exc:      # already gone: nothing left to close
        LOG.info("closing dpid %s from %s: %s", datapath.id, peer_of(datapath), exc)
