"""Netlink on the wire: message framing, attributes, and one request at a time.

`controllers.netlink.patch` and `controllers.netlink.lookup` write the few
messages on the timed or per-flow paths themselves (pyroute2's general
request path costs about a millisecond a call).  What they share is here:
the header, an attribute, and `Channel`, a kept socket that sends one request
and reads until the kernel's answer to that request arrives: a reply
message, an acknowledgement, or an error.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Callable, Optional, Tuple, Type

NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
NLA_F_NESTED = 0x8000
HEADER = struct.Struct("=IHHII")            # nlmsghdr: length, type, flags, seq, pid


def attr(kind: int, payload: bytes, nested: bool = False) -> bytes:
    """One netlink attribute, padded to four bytes."""
    header = struct.pack("=HH", 4 + len(payload), kind | (NLA_F_NESTED if nested else 0))
    data = header + payload
    return data + b"\0" * (-len(data) % 4)


def message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    return HEADER.pack(HEADER.size + len(body), kind, flags, seq, 0) + body


class Channel:
    """One kept netlink socket; `request` is safe from several threads."""

    def __init__(self, sock: socket.socket, error: Type[OSError] = OSError):
        self.sock = sock
        self.error = error
        self._seq = 0
        self._lock = threading.Lock()

    def request(self, build: Callable[[int], bytes]) -> Optional[bytes]:
        """Send ``build(seq)``; return the first reply message to it (header
        included), or None for a plain acknowledgement; raise ``error`` with
        the kernel's errno if it refused."""
        return self.timed_request(build)[0]

    def timed_request(self, build: Callable[[int], bytes]
                      ) -> Tuple[Optional[bytes], Tuple[float, float]]:
        """`request`, with the epoch times just before and just after the
        request was written.  The kernel carries an rtnetlink request out
        inside that write, so the change took effect between the two: a bound
        microseconds wide, where the whole call also holds building the bytes,
        reading the answer and whatever preempted this thread in between (a
        reconfiguration's dark time is counted from it)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            data = build(seq)
            before = time.time()
            self.sock.send(data)
            written = (before, time.time())
            while True:
                data = self.sock.recv(1 << 16)
                offset = 0
                while offset + HEADER.size <= len(data):
                    length, kind, _, got, _ = HEADER.unpack_from(data, offset)
                    if got == seq:
                        if kind != NLMSG_ERROR:
                            return data[offset:offset + length], written
                        (code,) = struct.unpack_from("=i", data, offset + HEADER.size)
                        if code:
                            raise self.error(-code, os.strerror(-code))
                        return None, written
                    offset += max(HEADER.size, (length + 3) & ~3)

    def close(self) -> None:
        self.sock.close()
