"""A router's destination routes, replaced many at a time: one write, then the acknowledgements.

A reroute after a failure rewrites the routes of every router the failure
touched: a failed ZCube switch meant 108 routes on 8 routers.  Through
pyroute2 each route is one request and one wait for its answer, about half
a millisecond here and twice that on a busy machine: 45-88 ms for those 108,
which is most of the time between a link going down and the controller
having routed around it, and most of its variation from one failure to the
next.  The kernel carries out every message of one write in order and
answers each, so here a router's whole batch is written at once and its
answers read after (`RouteWriter`).

The message, as ``ip route replace`` sends it
(``include/uapi/linux/rtnetlink.h``)::

    RTM_NEWROUTE  flags REQUEST | ACK | CREATE | REPLACE
                  rtmsg{AF_INET, dst_len 32, table (or RTA_TABLE), protocol,
                        scope universe, type unicast or blackhole,
                        flags ONLINK for a single next hop via a gateway}
                  RTA_DST, RTA_TABLE
                  one next hop:   RTA_OIF [, RTA_GATEWAY]
                  several:        RTA_MULTIPATH { rtnexthop{len, flags ONLINK, 0,
                                                  ifindex} [RTA_GATEWAY] ... }

Unit tests decode these bytes with pyroute2's own message classes, and check
them against what the kernel keeps.
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from controllers.netlink.wire import (HEADER, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST,
                                      NLMSG_ERROR, attr, message)

RTM_NEWROUTE = 24
NLM_F_REPLACE = 0x100
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_MULTIPATH, RTA_TABLE = 1, 4, 5, 9, 15
RTN_UNICAST, RTN_BLACKHOLE = 1, 6
RT_SCOPE_UNIVERSE = 0
RT_TABLE_UNSPEC = 0
RTNH_F_ONLINK = 4
_RTMSG = struct.Struct("=BBBBBBBBI")        # family, dst_len, src_len, tos, table,
                                            # protocol, scope, type, flags
_RTNEXTHOP = struct.Struct("=HBBi")         # len, flags, hops, ifindex
#: Messages per write: each answer carries its request back, and a few hundred
#: stay far below the socket's default receive buffer.
WRITE_MESSAGES = 256


@dataclass(frozen=True)
class NextHop:
    """Out of interface ``ifindex``; via ``gateway`` on-link, or straight to
    the destination (a host port) with none."""
    ifindex: int
    gateway: Optional[str] = None


@dataclass(frozen=True)
class RouteSpec:
    """A /32 route to ``dst_ip`` over ``hops``; no hop makes it a blackhole."""
    dst_ip: str
    hops: Tuple[NextHop, ...]
    table: int
    protocol: int


def route_replace(seq: int, route: RouteSpec) -> bytes:
    """The RTM_NEWROUTE message that replaces (or creates) ``route``."""
    kind = RTN_UNICAST if route.hops else RTN_BLACKHOLE
    single = route.hops[0] if len(route.hops) == 1 else None
    flags = RTNH_F_ONLINK if single is not None and single.gateway else 0
    table = route.table if route.table < 256 else RT_TABLE_UNSPEC
    body = _RTMSG.pack(socket.AF_INET, 32, 0, 0, table, route.protocol, RT_SCOPE_UNIVERSE,
                       kind, flags)
    body += attr(RTA_DST, socket.inet_aton(route.dst_ip))
    body += attr(RTA_TABLE, struct.pack("=I", route.table))
    if single is not None:
        body += attr(RTA_OIF, struct.pack("=I", single.ifindex))
        if single.gateway:
            body += attr(RTA_GATEWAY, socket.inet_aton(single.gateway))
    elif route.hops:
        hops = b""
        for hop in route.hops:
            gateway = attr(RTA_GATEWAY, socket.inet_aton(hop.gateway)) if hop.gateway else b""
            hops += _RTNEXTHOP.pack(_RTNEXTHOP.size + len(gateway),
                                    RTNH_F_ONLINK if hop.gateway else 0, 0,
                                    hop.ifindex) + gateway
        body += attr(RTA_MULTIPATH, hops)
    return message(RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
                   seq, body)


def answers(data: bytes) -> Dict[int, int]:
    """seq -> errno (0: done) of the acknowledgements and errors in ``data``."""
    found, offset = {}, 0
    while offset + HEADER.size <= len(data):
        length, kind, _, seq, _ = HEADER.unpack_from(data, offset)
        if length < HEADER.size:
            break
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, offset + HEADER.size)
            found[seq] = -code
        offset += (length + 3) & ~3
    return found


class RouteWriter:
    """Replaces routes in one router namespace over a kept netlink socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._seq = 0
        self._lock = threading.Lock()

    def replace(self, routes: Sequence[RouteSpec]) -> List[int]:
        """Replace every route of ``routes`` with one write; returns each one's
        errno in order (0: in effect).  The kernel answers each message, a
        refusal included, and goes on with the next."""
        codes: List[int] = []
        with self._lock:
            for start in range(0, len(routes), WRITE_MESSAGES):
                codes += self._write(routes[start:start + WRITE_MESSAGES])
        return codes

    def _write(self, routes: Sequence[RouteSpec]) -> List[int]:
        first = self._seq + 1
        self._seq += len(routes)
        self.sock.send(b"".join(route_replace(first + i, route)
                                for i, route in enumerate(routes)))
        codes: Dict[int, int] = {}
        wanted = set(range(first, first + len(routes)))
        while not wanted <= codes.keys():
            codes.update(answers(self.sock.recv(1 << 16)))
        return [codes[first + i] for i in range(len(routes))]

    def close(self) -> None:
        self.sock.close()

