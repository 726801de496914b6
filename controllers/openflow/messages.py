"""Intents as OpenFlow 1.3 messages (in the style of faucet's valve_of).

The builders are stateless and return parser objects with ``datapath=None``;
the applier binds the datapath just before sending.  `to_messages` is the
whole translation from `controllers.intents` to messages:

==============================  ================================================
intent                          OpenFlow 1.3
==============================  ================================================
Reset (packet switch)           delete every flow and group; table miss drops
Reset (OCS)                     delete every flow; table miss drops
Resync (packet switch)          table miss drops; every pin flow deleted (pins come
                                back after it, their pairs meanwhile routed)
Resync (OCS)                    table miss drops; strict deletes on the dark ports
Route after a Reset             group ADD (the ECMP ports) + flow ipv4_dst -> group
Route after a Resync            group ADD_OR_MOD + flow ADD: both replace in place
Route otherwise                 group MODIFY: one atomic message per reroute
Lightpath lit / dark            in_port=a -> output:b and b -> a / strict deletes
PinHop / UnpinHop               ipv4_src+ipv4_dst -> output at PRIORITY_PIN, cookie
                                COOKIE_PIN | serial / strict delete by that cookie
==============================  ================================================

A route's group id is its destination host's index in the fabric, so a
reroute names the same group the switch was given at start.
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Sequence

from controllers.intents import Intent, Lightpath, PinHop, Reset, Resync, Route, UnpinHop
from controllers.openflow.compat import ofp, parser

ETH_TYPE_IPV4 = 0x0800
PRIORITY_ROUTE = 100
PRIORITY_CIRCUIT = 100
PRIORITY_MISS = 0
PRIORITY_PIN = 200          # above PRIORITY_ROUTE: a pinned pair leaves its destination route
COOKIE_EPS = 0xE500
COOKIE_OCS = 0x0C5
COOKIE_PIN = 0x91 << 56     # pin cookies: this tag in the top byte, the pin's serial below
COOKIE_PIN_MASK = 0xFF << 56
COOKIE_EXACT = 2 ** 64 - 1
# Open vSwitch's extension of OpenFlow 1.1-1.4 (``ovs-ofctl mod-group
# --may-create``): create the group, or replace its buckets if it exists.  A
# resync cannot know which groups a switch lost, and ADD on an existing group
# is an error while MODIFY on a missing one is too.
OFPGC_ADD_OR_MOD = 0x8000


def flow_add(match, actions, priority: int, cookie: int, table_id: int = 0):
    instructions = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)] if actions else []
    return parser.OFPFlowMod(None, cookie=cookie, table_id=table_id, command=ofp.OFPFC_ADD,
                             priority=priority, match=match, instructions=instructions,
                             buffer_id=ofp.OFP_NO_BUFFER)


def flow_delete_strict(match, priority: int, table_id: int = 0):
    return parser.OFPFlowMod(None, table_id=table_id, command=ofp.OFPFC_DELETE_STRICT,
                             priority=priority, match=match, out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY)


def delete_all_flows():
    return parser.OFPFlowMod(None, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                             match=parser.OFPMatch(), out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY)


def delete_all_groups():
    return parser.OFPGroupMod(None, command=ofp.OFPGC_DELETE, type_=ofp.OFPGT_ALL,
                              group_id=ofp.OFPG_ALL)


def drop_on_miss():
    """Explicit table-miss drop: fabrics have loops, so nothing may flood."""
    return flow_add(parser.OFPMatch(), [], PRIORITY_MISS, COOKIE_EPS)


def delete_pin_flows():
    """Every pin flow of the switch, whatever its serial (cookie tag masked)."""
    return parser.OFPFlowMod(None, cookie=COOKIE_PIN, cookie_mask=COOKIE_PIN_MASK,
                             table_id=0, command=ofp.OFPFC_DELETE, match=parser.OFPMatch(),
                             out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)


def route_group(group_id: int, ports: Iterable[int], modify: bool = False,
                command: int = None):
    """The group a destination's flow points at: its ECMP output ports.

    Two or more ports make a select group (one bucket per port).  One port
    makes an indirect group: Open vSwitch implements select groups with a
    datapath hash and a recirculation, which doubles the per-packet work of
    its single-threaded userspace datapath even for a lone bucket.  No port
    makes an empty select group, which drops (unreachable).  A group MODIFY
    may change the type, so a reroute stays one atomic message.
    """
    ports = sorted(ports)
    if command is None:
        command = ofp.OFPGC_MODIFY if modify else ofp.OFPGC_ADD
    if len(ports) == 1:
        bucket = parser.OFPBucket(weight=0, watch_port=ofp.OFPP_ANY, watch_group=ofp.OFPG_ANY,
                                  actions=[parser.OFPActionOutput(ports[0])])
        return parser.OFPGroupMod(None, command=command, type_=ofp.OFPGT_INDIRECT,
                                  group_id=group_id, buckets=[bucket])
    buckets = [parser.OFPBucket(weight=1, watch_port=ofp.OFPP_ANY, watch_group=ofp.OFPG_ANY,
                                actions=[parser.OFPActionOutput(port)])
               for port in ports]
    return parser.OFPGroupMod(None, command=command, type_=ofp.OFPGT_SELECT,
                              group_id=group_id, buckets=buckets)


def route_to_group(ipv4_dst: str, group_id: int):
    match = parser.OFPMatch(eth_type=ETH_TYPE_IPV4, ipv4_dst=ipv4_dst)
    return flow_add(match, [parser.OFPActionGroup(group_id)], PRIORITY_ROUTE, COOKIE_EPS)


def pin_cookie(serial: int) -> int:
    return COOKIE_PIN | serial


def pin_match(ipv4_src: str, ipv4_dst: str):
    return parser.OFPMatch(eth_type=ETH_TYPE_IPV4, ipv4_src=ipv4_src, ipv4_dst=ipv4_dst)


def pin_flow(ipv4_src: str, ipv4_dst: str, out_port: int, cookie: int):
    """One switch's hop of a pinned path: this source-destination pair leaves by out_port."""
    return flow_add(pin_match(ipv4_src, ipv4_dst), [parser.OFPActionOutput(out_port)],
                    PRIORITY_PIN, cookie)


def pin_delete(ipv4_src: str, ipv4_dst: str, cookie: int):
    """Remove exactly the pin flow with this match and cookie (strict, cookie fully masked)."""
    return parser.OFPFlowMod(None, cookie=cookie, cookie_mask=COOKIE_EXACT, table_id=0,
                             command=ofp.OFPFC_DELETE_STRICT, priority=PRIORITY_PIN,
                             match=pin_match(ipv4_src, ipv4_dst), out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY)


def circuit_half(in_port: int, out_port: int):
    """One direction of a circuit: everything entering in_port leaves out_port."""
    return flow_add(parser.OFPMatch(in_port=in_port), [parser.OFPActionOutput(out_port)],
                    PRIORITY_CIRCUIT, COOKIE_OCS)


def circuit_half_delete(in_port: int):
    return flow_delete_strict(parser.OFPMatch(in_port=in_port), PRIORITY_CIRCUIT)


def circuit(a: int, b: int) -> List:
    return [circuit_half(a, b), circuit_half(b, a)]


def circuit_delete(a: int, b: int) -> List:
    return [circuit_half_delete(a), circuit_half_delete(b)]


def barrier():
    return parser.OFPBarrierRequest(None)


def port_stats_request(port_no: int = None):
    return parser.OFPPortStatsRequest(None, 0, ofp.OFPP_ANY if port_no is None else port_no)


# ---------------------------------------------------------------- intents
def to_messages(intents: Sequence[Intent], group_of: Callable[[str], int],
                is_ocs: bool) -> List:
    """One switch's intents as its messages, in order.

    ``group_of(host)`` is the group id of a destination (its fabric index);
    ``is_ocs`` says which reset the switch needs (an OCS holds no groups).
    """
    msgs: List = []
    installing = False
    group_command = ofp.OFPGC_MODIFY
    for intent in intents:
        if isinstance(intent, Reset):
            msgs += [delete_all_flows()] + ([] if is_ocs else [delete_all_groups()])
            msgs.append(drop_on_miss())
            installing, group_command = True, ofp.OFPGC_ADD
        elif isinstance(intent, Resync):
            # ADD of a flow that exists with the same match and priority
            # replaces its actions in place: no packet meets a missing entry.
            msgs.append(drop_on_miss())
            if is_ocs:
                msgs += [circuit_half_delete(port) for port in intent.dark_ports]
            else:
                msgs.append(delete_pin_flows())
            installing, group_command = True, OFPGC_ADD_OR_MOD
        elif isinstance(intent, Route):
            group = group_of(intent.dst)
            msgs.append(route_group(group, intent.ports, command=group_command))
            if installing:
                msgs.append(route_to_group(intent.dst_ip, group))
        elif isinstance(intent, Lightpath):
            msgs += circuit(intent.a, intent.b) if intent.lit else \
                circuit_delete(intent.a, intent.b)
        elif isinstance(intent, PinHop):
            msgs.append(pin_flow(intent.src_ip, intent.dst_ip, intent.port,
                                 pin_cookie(intent.serial)))
        elif isinstance(intent, UnpinHop):
            msgs.append(pin_delete(intent.src_ip, intent.dst_ip, pin_cookie(intent.serial)))
        else:
            raise TypeError(f"not an intent: {intent!r}")
    return msgs
