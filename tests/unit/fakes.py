"""Fake datapaths and flow tables for controller unit tests.

In the style of faucet's ``clib/fakeoftable.py``:

* ``FakeDatapath`` serialises every message it is sent into real OpenFlow 1.3
  bytes, parses them back with os-ken's parser (a hand decoder for the two
  controller-to-switch types os-ken cannot parse: group mod and barrier
  request), checks that re-serialising the parsed message gives the same
  bytes, and applies the parsed message to its ``FakeFlowTable``.  It can
  answer barrier requests synchronously, so an ``OpenFlowApplier`` (and the
  ``FabricService`` above it) runs without a switch or a thread.
* ``FakeFlowTable`` applies flow mods (add, delete, delete_strict) and group
  mods (add, modify, delete) with OpenFlow's semantics, and answers "which
  output ports may a packet with in_port=P, ipv4_dst=D leave by".
* ``FakeNetwork`` is one fake datapath per switch of a fabric, and ``trace``
  walks a packet hop by hop through the fake tables, following every ECMP
  branch, until it reaches a host, is dropped or loops.  ``send_intents``
  turns a core's intents into OpenFlow messages as the applier does and
  sends them, so a core's decisions can be traced packet by packet.
* ``RecordingApplier`` stands for any data plane: it keeps the batches a
  ``FabricService`` hands it, for tests that assert intents.
"""

from __future__ import annotations

import importlib
import ipaddress
import struct
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

from controllers.intents import Batch, Reset
from controllers.openflow.compat import FRAMEWORK, ofp, parser
from controllers.openflow.messages import to_messages
from topologies.fabric import HOST, OCS, Fabric

ofproto_parser = importlib.import_module(f"{FRAMEWORK}.ofproto.ofproto_parser")

ETH_TYPE_IPV4 = 0x0800


class FakeSwitchError(AssertionError):
    """The fake switch got a message a real OpenFlow 1.3 switch would reject."""


# ---------------------------------------------------------------- decoding
def _parse_group_mod(datapath, buf: bytes, xid: int):
    command, type_, group_id = struct.unpack_from(ofp.OFP_GROUP_MOD_PACK_STR, buf,
                                                  ofp.OFP_HEADER_SIZE)
    buckets, offset = [], ofp.OFP_GROUP_MOD_SIZE
    while offset < len(buf):
        bucket = parser.OFPBucket.parser(buf, offset)
        if bucket.len < ofp.OFP_BUCKET_SIZE:
            raise FakeSwitchError(f"group mod {group_id}: bucket of length {bucket.len}")
        buckets.append(bucket)
        offset += bucket.len
    if offset != len(buf):
        raise FakeSwitchError(f"group mod {group_id}: buckets overrun the message")
    msg = parser.OFPGroupMod(datapath, command=command, type_=type_, group_id=group_id,
                             buckets=buckets)
    msg.set_xid(xid)
    return msg


def decode(datapath, buf: bytes):
    """Parse OpenFlow 1.3 bytes back into an os-ken message, strictly."""
    version, msg_type, msg_len, xid = ofproto_parser.header(buf)
    if version != ofp.OFP_VERSION:
        raise FakeSwitchError(f"version 0x{version:02x}, expected OpenFlow 1.3")
    if msg_len != len(buf):
        raise FakeSwitchError(f"header length {msg_len} but {len(buf)} bytes serialised")
    if msg_type == ofp.OFPT_GROUP_MOD:
        msg = _parse_group_mod(datapath, buf, xid)
    elif msg_type == ofp.OFPT_BARRIER_REQUEST:
        if msg_len != ofp.OFP_HEADER_SIZE:
            raise FakeSwitchError(f"barrier request of {msg_len} bytes")
        msg = parser.OFPBarrierRequest(datapath)
        msg.set_xid(xid)
    elif msg_type == ofp.OFPT_MULTIPART_REQUEST:
        stats_type, flags = struct.unpack_from("!HH", buf, ofp.OFP_HEADER_SIZE)
        if stats_type != ofp.OFPMP_PORT_STATS or msg_len != ofp.OFP_MULTIPART_REQUEST_SIZE + 8:
            raise FakeSwitchError(f"the fake switch answers port stats only, got multipart "
                                  f"type {stats_type} of {msg_len} bytes")
        (port_no,) = struct.unpack_from("!I", buf, ofp.OFP_MULTIPART_REQUEST_SIZE)
        msg = parser.OFPPortStatsRequest(datapath, flags, port_no)
        msg.set_xid(xid)
    elif msg_type == ofp.OFPT_FLOW_MOD:
        msg = ofproto_parser.msg(datapath, version, msg_type, msg_len, xid, buf)
        if msg is None:
            raise FakeSwitchError(f"os-ken could not parse flow mod bytes {buf.hex()}")
    else:
        raise FakeSwitchError(f"the fake switch does not expect message type {msg_type}")
    # Parsing and serialising again must give the very same bytes.
    msg.datapath = datapath
    msg.serialize()
    if bytes(msg.buf) != buf:
        raise FakeSwitchError(f"{type(msg).__name__} does not round-trip: sent {buf.hex()}, "
                              f"re-serialised {bytes(msg.buf).hex()}")
    return msg


# ---------------------------------------------------------------- flow table
def _actions(action_list, where: str) -> Tuple[Tuple[str, int], ...]:
    result = []
    for action in action_list:
        if isinstance(action, parser.OFPActionOutput):
            if not 1 <= action.port < ofp.OFPP_MAX:
                raise FakeSwitchError(f"{where}: output to reserved port {action.port:#x}")
            result.append(("output", action.port))
        elif isinstance(action, parser.OFPActionGroup):
            result.append(("group", action.group_id))
        else:
            raise FakeSwitchError(f"{where}: unsupported action {action}")
    return tuple(result)


@dataclass
class FlowEntry:
    table_id: int
    priority: int
    match: Dict[str, object]
    actions: Tuple[Tuple[str, int], ...]
    cookie: int = 0

    def matches(self, packet: Dict[str, object]) -> bool:
        for key, want in self.match.items():
            have = packet.get(key)
            if have is None:
                return False
            if key == "ipv4_dst":
                network = (ipaddress.ip_network(f"{want[0]}/{want[1]}", strict=False)
                           if isinstance(want, tuple) else ipaddress.ip_network(want))
                if ipaddress.ip_address(have) not in network:
                    return False
            elif have != want:
                return False
        return True

    def outputs_to(self, out_port: int, out_group: int) -> bool:
        """The out_port / out_group filter of delete commands."""
        if out_port != ofp.OFPP_ANY and ("output", out_port) not in self.actions:
            return False
        if out_group != ofp.OFPG_ANY and ("group", out_group) not in self.actions:
            return False
        return True


@dataclass
class FakeGroup:
    type_: int
    buckets: List[Tuple[Tuple[str, int], ...]]


@dataclass
class FakeFlowTable:
    """One switch's flows and groups, changed by parsed OpenFlow messages."""

    name: str = "switch"
    flows: List[FlowEntry] = field(default_factory=list)
    groups: Dict[int, FakeGroup] = field(default_factory=dict)

    # ------------------------------------------------------------ updates
    def apply(self, msg) -> None:
        if isinstance(msg, parser.OFPFlowMod):
            self._flow_mod(msg)
        elif isinstance(msg, parser.OFPGroupMod):
            self._group_mod(msg)
        elif not isinstance(msg, (parser.OFPBarrierRequest, parser.OFPPortStatsRequest)):
            raise FakeSwitchError(f"{self.name}: unexpected {type(msg).__name__}")

    def _flow_mod(self, msg) -> None:
        match = dict(msg.match.items())
        where = f"{self.name} flow mod {match} priority {msg.priority}"
        if msg.command == ofp.OFPFC_ADD:
            actions = []
            for inst in msg.instructions:
                if not (isinstance(inst, parser.OFPInstructionActions)
                        and inst.type == ofp.OFPIT_APPLY_ACTIONS):
                    raise FakeSwitchError(f"{where}: unsupported instruction {inst}")
                actions += _actions(inst.actions, where)
            for kind, value in actions:
                if kind == "group" and value not in self.groups:
                    raise FakeSwitchError(f"{where}: OFPBAC_BAD_OUT_GROUP, no group {value}")
            if msg.table_id >= ofp.OFPTT_MAX:
                raise FakeSwitchError(f"{where}: add to table {msg.table_id:#x}")
            self.flows = [f for f in self.flows
                          if not (f.table_id == msg.table_id and f.priority == msg.priority
                                  and f.match == match)]
            self.flows.append(FlowEntry(msg.table_id, msg.priority, match, tuple(actions),
                                        msg.cookie))
        elif msg.command in (ofp.OFPFC_DELETE, ofp.OFPFC_DELETE_STRICT):
            strict = msg.command == ofp.OFPFC_DELETE_STRICT

            def doomed(entry: FlowEntry) -> bool:
                if msg.table_id != ofp.OFPTT_ALL and entry.table_id != msg.table_id:
                    return False
                if strict:
                    if entry.priority != msg.priority or entry.match != match:
                        return False
                elif any(entry.match.get(k) != v for k, v in match.items()):
                    return False
                return entry.outputs_to(msg.out_port, msg.out_group)

            self.flows = [f for f in self.flows if not doomed(f)]
        else:
            raise FakeSwitchError(f"{where}: the fake does not model command {msg.command}")

    def _group_mod(self, msg) -> None:
        where = f"{self.name} group mod {msg.group_id}"
        if msg.command == ofp.OFPGC_DELETE:
            doomed = set(self.groups) if msg.group_id == ofp.OFPG_ALL else {msg.group_id}
            for group_id in doomed:
                self.groups.pop(group_id, None)
            # OpenFlow 1.3: deleting a group removes the flows that forward to it.
            self.flows = [f for f in self.flows
                          if not any(k == "group" and v in doomed for k, v in f.actions)]
            return
        if msg.group_id > ofp.OFPG_MAX:
            raise FakeSwitchError(f"{where}: reserved group id")
        buckets = [_actions(b.actions, where) for b in msg.buckets]
        if msg.command == ofp.OFPGC_ADD:
            if msg.group_id in self.groups:
                raise FakeSwitchError(f"{where}: OFPGMFC_GROUP_EXISTS")
        elif msg.command == ofp.OFPGC_MODIFY:
            if msg.group_id not in self.groups:
                raise FakeSwitchError(f"{where}: OFPGMFC_UNKNOWN_GROUP")
        else:
            raise FakeSwitchError(f"{where}: unknown command {msg.command}")
        if any(kind == "group" for bucket in buckets for kind, _ in bucket):
            raise FakeSwitchError(f"{where}: chained groups are not modelled")
        self.groups[msg.group_id] = FakeGroup(msg.type, buckets)

    # ------------------------------------------------------------ lookups
    def group_ports(self, group_id: int) -> FrozenSet[int]:
        """Every port a group may send to (a select group picks one bucket)."""
        return frozenset(port for bucket in self.groups[group_id].buckets
                         for kind, port in bucket if kind == "output")

    def output_ports(self, in_port: int, ipv4_dst: Optional[str] = None,
                     eth_type: int = ETH_TYPE_IPV4) -> FrozenSet[int]:
        """Ports the packet may leave by; empty means dropped."""
        packet = {"in_port": in_port, "eth_type": eth_type, "ipv4_dst": ipv4_dst}
        hits = [f for f in self.flows if f.table_id == 0 and f.matches(packet)]
        if not hits:
            return frozenset()
        top = max(f.priority for f in hits)
        best = [f for f in hits if f.priority == top]
        if len({f.actions for f in best}) > 1:
            raise FakeSwitchError(f"{self.name}: overlapping flows of priority {top} with "
                                  f"different actions for {packet}: {best}")
        ports = set()
        for kind, value in best[0].actions:
            ports |= {value} if kind == "output" else self.group_ports(value)
        return frozenset(ports)


# ---------------------------------------------------------------- datapath
Callback = Callable[["FakeDatapath", object], None]


class FakeDatapath:
    """Just enough of os-ken's Datapath for the controller code."""

    def __init__(self, dpid: int, name: str = "",
                 on_barrier: Optional[Callable[["FakeDatapath", int], None]] = None,
                 journal: Optional[list] = None, address: Tuple[str, int] = ("127.0.0.1", 0)):
        self.id = dpid
        self.name = name or f"dpid{dpid}"
        self.address = address               # the peer, as os-ken's Datapath has it
        self.closed = False                   # close() was called, as os-ken's
        self.ofproto = ofp
        self.ofproto_parser = parser
        self.xid = 0
        self.table = FakeFlowTable(self.name)
        self.sent: List[object] = []          # parsed messages, in order
        self.journal = journal                # shared (name, msg) log across switches
        self.on_barrier = on_barrier          # e.g. FabricService.barrier_replied
        self.on_message: Optional[Callback] = None   # called after a message is applied
        # Port stats: bytes sent per port, and who hears the reply (e.g. the
        # os-ken handler, or OpenFlowApplier.port_stats_replied).
        self.tx_bytes: Dict[int, int] = {}
        self.on_port_stats: Optional[Callable[["FakeDatapath", object], None]] = None

    def set_xid(self, msg) -> int:
        if msg.xid:
            return msg.xid
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid

    def send_msg(self, msg) -> None:
        if self.closed:
            raise FakeSwitchError(f"{self.name}: a message sent on a closed connection")
        if msg.datapath is not self:
            raise FakeSwitchError(f"{self.name}: message bound to {msg.datapath}, not this "
                                  "datapath")
        if msg.xid is None:
            self.set_xid(msg)
        msg.serialize()
        parsed = decode(self, bytes(msg.buf))
        self.table.apply(parsed)
        self.sent.append(parsed)
        if self.journal is not None:
            self.journal.append((self.name, parsed))
        if self.on_message is not None:
            self.on_message(self, parsed)
        if isinstance(parsed, parser.OFPBarrierRequest) and self.on_barrier is not None:
            self.on_barrier(self, parsed.xid)
        if isinstance(parsed, parser.OFPPortStatsRequest) and self.on_port_stats is not None:
            self.on_port_stats(self, self.port_stats_reply(parsed))

    def port_stats_reply(self, request):
        """The reply a switch gives: one OFPPortStats per port of ``tx_bytes``."""
        body = [parser.OFPPortStats(port_no=port, rx_packets=0, tx_packets=count // 1000,
                                    rx_bytes=0, tx_bytes=count, rx_dropped=0, tx_dropped=0,
                                    rx_errors=0, tx_errors=0, rx_frame_err=0, rx_over_err=0,
                                    rx_crc_err=0, collisions=0, duration_sec=1, duration_nsec=0)
                for port, count in sorted(self.tx_bytes.items())
                if request.port_no in (port, ofp.OFPP_ANY)]
        reply = parser.OFPPortStatsReply(self, body=body, flags=0)
        reply.xid = request.xid
        return reply

    def close(self) -> None:
        """As os-ken's: the connection is marked dead; nothing more is sent on it."""
        self.closed = True

    def send_all(self, msgs) -> None:
        """Bind and send messages from a core, as the app shim does."""
        for msg in msgs:
            msg.datapath = self
            self.send_msg(msg)


def features_reply(datapath: "FakeDatapath", dpid: int, xid: int = 1):
    """A switch's OFPT_FEATURES_REPLY for ``dpid`` as it comes off the wire: packed
    into OpenFlow 1.3 bytes and parsed by os-ken, which then sets the datapath's
    id from it (os-ken's ofp_handler does, before any application hears of it)."""
    body = struct.pack(ofp.OFP_SWITCH_FEATURES_PACK_STR, dpid, 256, 254, 0, 0x4f, 0)
    buf = struct.pack(ofp.OFP_HEADER_PACK_STR, ofp.OFP_VERSION, ofp.OFPT_FEATURES_REPLY,
                      ofp.OFP_SWITCH_FEATURES_SIZE, xid) + body
    version, msg_type, msg_len, parsed_xid = ofproto_parser.header(buf)
    msg = ofproto_parser.msg(datapath, version, msg_type, msg_len, parsed_xid, buf)
    if not isinstance(msg, parser.OFPSwitchFeatures) or msg.datapath_id != dpid:
        raise FakeSwitchError(f"features reply for dpid {dpid} did not parse back: {msg}")
    datapath.id = msg.datapath_id
    return msg


# ---------------------------------------------------------------- network
@dataclass(frozen=True)
class Hop:
    node: str
    in_port: int
    out_port: int


@dataclass
class Trace:
    delivered: List[List[Hop]] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)

    def nodes(self) -> List[List[str]]:
        return [[hop.node for hop in path] for path in self.delivered]


def trace(fabric: Fabric, tables: Dict[str, FakeFlowTable], src: str, dst: str,
          max_hops: int = 32, start: Optional[Tuple[str, int]] = None) -> Trace:
    """Follow a packet src -> dst through the fake tables, every ECMP branch.

    ``start`` is (switch, in_port) to inject somewhere else than at src's
    switch.  A branch fails if it is dropped, reaches another host, loops
    (the same switch and in_port twice) or exceeds max_hops.
    """
    ip = fabric.graph.nodes[dst]["ip"]
    result = Trace()
    switch, in_port = start or fabric.host_port(src)
    stack: List[Tuple[str, int, List[Hop]]] = [(switch, in_port, [])]
    while stack:
        node, in_port, path = stack.pop()
        where = " -> ".join(f"{h.node}:{h.in_port}>{h.out_port}" for h in path) or "start"
        if len(path) >= max_hops:
            result.failures.append(f"over {max_hops} hops: {where}")
            continue
        ports = tables[node].output_ports(in_port, ip)
        if not ports:
            result.failures.append(f"dropped at {node} (in_port {in_port}) after {where}")
            continue
        for port in sorted(ports):
            hops = path + [Hop(node, in_port, port)]
            if port == in_port:
                result.failures.append(f"{node} sends back out of in_port {port} after {where}")
                continue
            peer, peer_port = fabric.peer(node, port)
            if fabric.kind(peer) == HOST:
                if peer == dst:
                    result.delivered.append(hops)
                else:
                    result.failures.append(f"delivered to {peer} instead of {dst} via {hops}")
            elif any(h.node == peer and h.in_port == peer_port for h in hops):
                result.failures.append(f"loop back into {peer}:{peer_port} via {hops}")
            else:
                stack.append((peer, peer_port, hops))
    return result


class FakeNetwork:
    """One fake datapath per switch of a fabric, sharing one journal."""

    def __init__(self, fabric: Fabric,
                 on_barrier: Optional[Callable[[FakeDatapath, int], None]] = None):
        self.fabric = fabric
        self.journal: List[Tuple[str, object]] = []
        self.datapaths: Dict[str, FakeDatapath] = {
            name: FakeDatapath(fabric.graph.nodes[name]["dpid"], name, on_barrier, self.journal)
            for name in fabric.switches}

    def connect(self, applier, service) -> None:
        """Connect every switch to an OpenFlowApplier with the service's start
        intents, as the os-ken app does.

        os-ken handles one event at a time, so the reply to the barrier that
        ends a switch's initial messages is processed only after the
        switch-features handler returned; replaying it here models that
        (the synchronous reply sent during the handler came too early).
        """
        for name, datapath in self.datapaths.items():
            applier.switch_connected(datapath, service.start(name))
            barriers = [m for m in datapath.sent if isinstance(m, parser.OFPBarrierRequest)]
            applier.barrier_replied(datapath, barriers[-1].xid)

    def messages(self, switch: str, intents) -> List:
        """A switch's intents as the OpenFlow applier translates them."""
        return to_messages(intents, lambda host: self.fabric.graph.nodes[host]["index"],
                           self.fabric.kind(switch) == OCS)

    def send_intents(self, batch: Batch) -> None:
        """Translate each switch's intents to OpenFlow 1.3 and send them (no barrier)."""
        for switch, intents in batch.items():
            self.datapaths[switch].send_all(self.messages(switch, intents))

    def start(self, switch: str, intents) -> None:
        """Bring an empty switch to ``intents``, as a Reset followed by them."""
        self.send_intents({switch: [Reset(switch)] + list(intents)})

    @property
    def tables(self) -> Dict[str, FakeFlowTable]:
        return {name: dp.table for name, dp in self.datapaths.items()}

    def trace(self, src: str, dst: str, **kwargs) -> Trace:
        return trace(self.fabric, self.tables, src, dst, **kwargs)

    def ocs_hops(self, paths: List[List[Hop]]) -> set:
        """The OCS port pairs (as circuits) that the given paths cross."""
        return {tuple(sorted((h.in_port, h.out_port))) for path in paths for h in path
                if self.fabric.kind(h.node) == OCS}


def assert_delivered(network: FakeNetwork, src: str, dst: str) -> Trace:
    """Every branch of src -> dst ends at dst; the failure lists what went wrong."""
    result = network.trace(src, dst)
    assert not result.failures, (f"{src} -> {dst}: expected every ECMP branch to reach {dst}, "
                                 f"but: {result.failures}")
    assert result.delivered, f"{src} -> {dst}: no path reached {dst}"
    return result


class RecordingApplier:
    """An applier that records each batch it is given; every switch is ready."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        self.batches: List[Batch] = []
        self.syncs = 0
        self.errors: List[str] = []

    def apply(self, batch: Batch) -> None:
        self.batches.append({switch: list(intents) for switch, intents in batch.items()})

    def sync(self) -> None:
        self.syncs += 1

    def status(self) -> dict:
        return {"connected": list(self.fabric.switches),
                "ready_switches": list(self.fabric.switches), "errors": list(self.errors)}

    def counters(self) -> Dict[str, Dict[int, dict]]:
        return {switch: {port: {"tx_bytes": 0, "rx_bytes": 0}
                         for port in self.fabric.ports_of(switch)}
                for switch in self.fabric.switches}
