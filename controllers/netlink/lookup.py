"""Which port a router sends one flow out of: the kernel's own multipath choice.

A router picks a flow's next hop by a hash of its addresses, protocol and
ports (``fib_multipath_hash_policy=3`` with those fields, set by
`topologies.mininet_topo`), so two flows of one host pair may
take different paths, and two flows of different pairs may meet on one link.
The kernel answers "which way would this packet go" for a given five-tuple
(``ip route get ... ipproto tcp sport S dport D iif IF``), as if the packet
had arrived on the interface it came in by.  pyroute2 drops the port
attributes of that request, so it is written here::

    RTM_GETROUTE  rtmsg{AF_INET, dst_len 32, src_len 32}
                  RTA_DST, RTA_SRC, RTA_IIF, RTA_IP_PROTO, RTA_SPORT, RTA_DPORT
    reply         RTM_NEWROUTE ... RTA_OIF (the output interface)
"""

from __future__ import annotations

import socket
import struct
from typing import Optional

from controllers.netlink.wire import HEADER, NLM_F_REQUEST, Channel, attr, message

RTM_NEWROUTE, RTM_GETROUTE = 24, 26
RTA_DST, RTA_SRC, RTA_IIF, RTA_OIF = 1, 2, 3, 4
RTA_IP_PROTO, RTA_SPORT, RTA_DPORT = 27, 28, 29
_RTMSG = struct.Struct("=BBBBBBBBI")          # family, dst_len, src_len, tos, table,
                                              # protocol, scope, type, flags


def route_get(seq: int, dst: str, src: str, iif: int, proto: int, sport: int,
              dport: int) -> bytes:
    body = _RTMSG.pack(socket.AF_INET, 32, 32, 0, 0, 0, 0, 0, 0)
    body += attr(RTA_DST, socket.inet_aton(dst)) + attr(RTA_SRC, socket.inet_aton(src))
    body += attr(RTA_IIF, struct.pack("=I", iif)) + attr(RTA_IP_PROTO, bytes([proto]))
    body += attr(RTA_SPORT, struct.pack("!H", sport)) + attr(RTA_DPORT, struct.pack("!H", dport))
    return message(RTM_GETROUTE, NLM_F_REQUEST, seq, body)


def output_interface(reply: bytes) -> Optional[int]:
    """RTA_OIF of an RTM_NEWROUTE message (its netlink header included)."""
    offset = HEADER.size + _RTMSG.size
    length = struct.unpack_from("=I", reply)[0]
    while offset + 4 <= length:
        attr_length, kind = struct.unpack_from("=HH", reply, offset)
        if attr_length < 4:
            break
        if kind == RTA_OIF:
            return struct.unpack_from("=I", reply, offset + 4)[0]
        offset += (attr_length + 3) & ~3
    return None


class RouteLookupError(OSError):
    """The kernel found no route for the flow (or refused the question)."""


class RouteLookup:
    """Asks one router namespace's kernel where a flow goes, over a kept socket."""

    def __init__(self, sock: socket.socket):
        self.channel = Channel(sock, RouteLookupError)

    def output(self, dst: str, src: str, iif: int, sport: int, dport: int,
               proto: int = socket.IPPROTO_TCP) -> Optional[int]:
        reply = self.channel.request(
            lambda seq: route_get(seq, dst, src, iif, proto, sport, dport))
        return output_interface(reply) if reply else None

    def close(self) -> None:
        self.channel.close()
