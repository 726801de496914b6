"""A namespace's port counters, read over a netlink socket that serves nothing else.

The load sampler asks for every switch's counters twice a second, on a
control connection of its own, while another connection's thread
reconfigures or reroutes.  The applier's route socket goes through the one
netlink thread (`controllers.netlink.namespaces.ThreadBoundSocket`), so a
link dump there would queue ahead of a route change, and pyroute2 would
spend about a millisecond a namespace parsing it.  `LinkStats` keeps a plain
socket of the namespace for the counters alone and writes the one request
itself::

    RTM_GETLINK  ifinfomsg{AF_UNSPEC}             NLM_F_REQUEST | NLM_F_DUMP
    reply        RTM_NEWLINK ifinfomsg{index} ... IFLA_STATS64 (rtnl_link_stats64),
                 one per interface, over one or more datagrams; then NLMSG_DONE
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from typing import Dict

from controllers.netlink.wire import HEADER, NLM_F_REQUEST, NLMSG_ERROR, message

RTM_NEWLINK, RTM_GETLINK = 16, 18
NLMSG_DONE = 3
NLM_F_DUMP = 0x300
IFLA_STATS64 = 23
IFINFO = struct.Struct("=BxHiII")             # family, type, index, flags, change
ATTR = struct.Struct("=HH")                   # length, type
# The leading fields of struct rtnl_link_stats64 (include/uapi/linux/if_link.h),
# each a __u64, in their order there; the counters the controller reports.
STATS64_FIELDS = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_errors",
                  "tx_errors", "rx_dropped", "tx_dropped")
STATS64 = struct.Struct("=" + "Q" * len(STATS64_FIELDS))


class LinkStatsError(OSError):
    """The kernel refused the dump."""


def link_dump(seq: int) -> bytes:
    return message(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq,
                   IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0))


def parse_link(data: bytes, offset: int, length: int):
    """(ifindex, counters or None) of one RTM_NEWLINK message at ``offset``."""
    body = offset + HEADER.size
    _, _, index, _, _ = IFINFO.unpack_from(data, body)
    at = body + IFINFO.size
    while at + ATTR.size <= offset + length:
        attr_length, kind = ATTR.unpack_from(data, at)
        if attr_length < ATTR.size:
            break
        if kind == IFLA_STATS64 and attr_length >= ATTR.size + STATS64.size:
            return index, dict(zip(STATS64_FIELDS, STATS64.unpack_from(data, at + ATTR.size)))
        at += (attr_length + 3) & ~3
    return index, None


class LinkStats:
    """Counters of every interface of one namespace, one dump per call.

    Calls from several threads take turns (one dump on the socket at a time).
    """

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._seq = 0
        self._lock = threading.Lock()

    def by_index(self) -> Dict[int, dict]:
        """``{ifindex: {"rx_bytes": ..., ...}}`` for every interface that has them."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            self.sock.send(link_dump(seq))
            found: Dict[int, dict] = {}
            while True:
                data = self.sock.recv(1 << 16)
                offset = 0
                while offset + HEADER.size <= len(data):
                    length, kind, _, got, _ = HEADER.unpack_from(data, offset)
                    if length < HEADER.size:
                        break
                    # Messages of another sequence are what an interrupted call
                    # left behind: not ours to read.
                    if got == seq:
                        if kind == NLMSG_DONE:
                            return found
                        if kind == NLMSG_ERROR:
                            (code,) = struct.unpack_from("=i", data, offset + HEADER.size)
                            if code:
                                raise LinkStatsError(-code, os.strerror(-code))
                            return found
                        if kind == RTM_NEWLINK:
                            index, counters = parse_link(data, offset, length)
                            if counters is not None:
                                found[index] = counters
                    offset += (length + 3) & ~3

    def close(self) -> None:
        self.sock.close()
