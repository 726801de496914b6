"""Which port a router sends one flow out of: the kernel's own multipath choice.

With ``fib_multipath_hash_policy=1`` a router picks a flow's next hop by a
hash of its addresses, protocol and ports, so two flows of one host pair may
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

import os
import socket
import struct
import threading
from typing import Optional

from controllers.netlink.patch import NLM_F_REQUEST, NLMSG_ERROR, _HEADER, _attr

RTM_NEWROUTE, RTM_GETROUTE = 24, 26
RTA_DST, RTA_SRC, RTA_IIF, RTA_OIF = 1, 2, 3, 4
RTA_IP_PROTO, RTA_SPORT, RTA_DPORT = 27, 28, 29
_RTMSG = struct.Struct("=BBBBBBBBI")          # family, dst_len, src_len, tos, table,
                                              # protocol, scope, type, flags


def route_get(seq: int, dst: str, src: str, iif: int, proto: int, sport: int,
              dport: int) -> bytes:
    body = _RTMSG.pack(socket.AF_INET, 32, 32, 0, 0, 0, 0, 0, 0)
    body += _attr(RTA_DST, socket.inet_aton(dst)) + _attr(RTA_SRC, socket.inet_aton(src))
    body += _attr(RTA_IIF, struct.pack("=I", iif)) + _attr(RTA_IP_PROTO, bytes([proto]))
    body += _attr(RTA_SPORT, struct.pack("!H", sport)) + _attr(RTA_DPORT, struct.pack("!H", dport))
    return _HEADER.pack(_HEADER.size + len(body), RTM_GETROUTE, NLM_F_REQUEST, seq, 0) + body


def output_interface(reply: bytes) -> Optional[int]:
    """RTA_OIF of an RTM_NEWROUTE message (its netlink header included)."""
    offset = _HEADER.size + _RTMSG.size
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
        self.sock = sock
        self._seq = 0
        self._lock = threading.Lock()

    def output(self, dst: str, src: str, iif: int, sport: int, dport: int,
               proto: int = socket.IPPROTO_TCP) -> Optional[int]:
        with self._lock:
            self._seq += 1
            seq = self._seq
            self.sock.send(route_get(seq, dst, src, iif, proto, sport, dport))
            while True:
                data = self.sock.recv(1 << 16)
                offset = 0
                while offset + _HEADER.size <= len(data):
                    length, kind, _, got, _ = _HEADER.unpack_from(data, offset)
                    if got == seq and kind == RTM_NEWROUTE:
                        return output_interface(data[offset:offset + length])
                    if got == seq and kind == NLMSG_ERROR:
                        (code,) = struct.unpack_from("=i", data, offset + _HEADER.size)
                        raise RouteLookupError(-code, os.strerror(-code))
                    offset += max(_HEADER.size, (length + 3) & ~3)

    def close(self) -> None:
        self.sock.close()
