"""Link changes in the switches' namespaces, as port status for the controller.

A link taken down from Mininet (both veth ends down) shows in the router's
namespace as an RTM_NEWLINK message: the port's own end lost IFF_UP, or its
peer's end did and the port lost carrier (IFF_LOWER_UP).  `LinkWatcher` reads
the event sockets of every namespace in one thread and reports each change
of a fabric port's state once, as ``(switch, port, up)``: what the OpenFlow
app reports on a port-status message.  It reports changes together: a
failing switch takes its links down one after another, over a few
milliseconds and in several namespaces, so once a change arrives the
watcher keeps reading until none has come for `SETTLE_S` (`MAX_SETTLE_S` at
most), as a router's SPF throttle waits before its first run.  Without the
wait the first link's datagram was often read alone: the controller
rerouted around it (100 routes took 50 ms to write), then around the rest,
and a switch failure was rerouted in 77-154 ms, varying with how its
events happened to split.
"""

from __future__ import annotations

import logging
import selectors
import struct
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple

LOG = logging.getLogger("fabric.netlink.events")

RTM_NEWLINK = 16
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
NLMSG_HEADER = struct.Struct("=IHHII")        # length, type, flags, seq, pid
IFINFO = struct.Struct("=BxHiII")             # family, type, index, flags, change
RTA_HEADER = struct.Struct("=HH")             # length, type
IFLA_IFNAME = 3

#: Once a change has arrived, read on until no event came for this long...
SETTLE_S = 0.005
#: ...but report at most this long after the first change (a flapping port).
MAX_SETTLE_S = 0.05

Change = Tuple[str, int, bool]                # switch, port, up
OnChanges = Callable[[List[Change]], None]


def link_messages(data: bytes) -> Iterator[Tuple[str, int]]:
    """(interface name, flags) of every RTM_NEWLINK message in a netlink datagram."""
    offset = 0
    while offset + NLMSG_HEADER.size <= len(data):
        length, kind, _, _, _ = NLMSG_HEADER.unpack_from(data, offset)
        if length < NLMSG_HEADER.size:
            break
        if kind == RTM_NEWLINK:
            body = offset + NLMSG_HEADER.size
            _, _, _, flags, _ = IFINFO.unpack_from(data, body)
            name = None
            attr = body + IFINFO.size
            while attr + RTA_HEADER.size <= offset + length:
                attr_length, attr_type = RTA_HEADER.unpack_from(data, attr)
                if attr_length < RTA_HEADER.size:
                    break
                if attr_type == IFLA_IFNAME:
                    name = data[attr + RTA_HEADER.size:attr + attr_length].split(b"\0")[0]
                    break
                attr += (attr_length + 3) & ~3
            if name is not None:
                yield name.decode(errors="replace"), flags
        offset += (length + 3) & ~3


def is_up(flags: int) -> bool:
    return bool(flags & IFF_UP) and bool(flags & IFF_LOWER_UP)


class LinkWatcher:
    """Reads link events of many namespaces; reports fabric port changes once each."""

    def __init__(self, port_of: Callable[[str, str], Optional[int]], on_changes: OnChanges):
        self.port_of = port_of                     # (switch, ifname) -> port or None
        self.on_changes = on_changes
        self._selector = selectors.DefaultSelector()
        self._state: Dict[Tuple[str, int], bool] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def watch(self, switch: str, sock, ports_up: Dict[int, bool]) -> None:
        """Add a namespace's event socket, with its ports' current state."""
        for port, up in ports_up.items():
            self._state[(switch, port)] = up
        self._selector.register(sock, selectors.EVENT_READ, switch)

    def start(self) -> "LinkWatcher":
        self._thread = threading.Thread(target=self._run, name="link-events", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            changes: List[Change] = []
            first: Optional[float] = None
            ready = self._selector.select(timeout=0.2)
            while ready:
                for key, _ in ready:
                    try:
                        data = key.fileobj.recv(1 << 16)
                    except OSError:
                        continue
                    changes += self.handle(key.data, data)
                if changes and first is None:
                    first = time.monotonic()
                wait_s = 0.0 if first is None else \
                    max(0.0, min(SETTLE_S, first + MAX_SETTLE_S - time.monotonic()))
                ready = self._selector.select(timeout=wait_s)   # what else comes
            if changes:
                self.on_changes(changes)

    def handle(self, switch: str, data: bytes) -> List[Change]:
        """The changes of fabric ports one datagram of a switch brings."""
        changes = []
        for name, flags in link_messages(data):
            port = self.port_of(switch, name)
            if port is None:
                continue
            up = is_up(flags)
            if self._state.get((switch, port)) == up:
                continue
            self._state[(switch, port)] = up
            LOG.debug("%s port %d (%s) %s", switch, port, name, "up" if up else "down")
            changes.append((switch, port, up))
        return changes

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()
