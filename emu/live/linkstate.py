"""Taking a fabric's interfaces down or up all at once, over netlink.

A switch that fails loses every link together.  Starting one ``ip -batch``
process per namespace (`emu.live.shaping.run_batches`) spreads that over the
process starts: 24-34 ms for a ZCube switch and its four hosts on an idle
machine here, 46-66 ms with two cores busy, and the controller's notice of
the failure was measured from the first of them.  A netlink socket opened
in each namespace ahead of time (`controllers.netlink.namespaces`: entered
by a thread with setns(2), no process forked) changes an interface's flags
with one message, so the links go down within a millisecond or so of each
other, busy machine or not.

::

    ready([(pid, "s6-eth1"), (None, "s6-eth2"), ...])   # sockets, indexes: ahead
    change([...], up=False)                              # one message each: at once
"""

from __future__ import annotations

import socket
import struct
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from controllers.netlink.namespaces import (NETLINK_ROUTE, NamespaceError, in_namespace,
                                           netlink_socket)
from controllers.netlink.wire import NLM_F_ACK, NLM_F_REQUEST, Channel, message

#: An interface: the pid holding its network namespace (None: this one), its name.
Interface = Tuple[Optional[int], str]

RTM_NEWLINK = 16
IFF_UP = 0x1
IFINFOMSG = struct.Struct("=BxHiII")     # family, type, index, flags, change


class LinkStateError(RuntimeError):
    """An interface could not be found or changed."""


class LinkSwitch:
    """Interfaces' administrative state, set over netlink in their namespaces."""

    def __init__(self):
        self._channels: Dict[Optional[int], Channel] = {}
        self._index: Dict[Interface, int] = {}

    def ready(self, interfaces: Iterable[Interface]) -> None:
        """Open what changing these interfaces needs (a socket per namespace,
        each interface's index), so that `change` only sends messages."""
        wanted: Dict[Optional[int], List[str]] = {}
        for pid, name in interfaces:
            if (pid, name) not in self._index:
                wanted.setdefault(pid, []).append(name)
        for pid, names in wanted.items():
            indexes = _in_namespace(pid, lambda: [_index_of(name) for name in names])
            missing = [name for name, index in zip(names, indexes) if index is None]
            if missing:
                raise LinkStateError(f"no interface {', '.join(missing)} in {_where(pid)}")
            if pid not in self._channels:
                try:
                    if pid is None:
                        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
                        sock.bind((0, 0))
                    else:
                        sock = netlink_socket(pid)
                except (OSError, NamespaceError) as exc:
                    raise LinkStateError(f"cannot open netlink in {_where(pid)}: {exc}") \
                        from None
                self._channels[pid] = Channel(sock)
            self._index.update({(pid, name): index for name, index in zip(names, indexes)})

    def change(self, interfaces: Iterable[Interface], up: bool) -> None:
        """Set every interface up or down, one message after another."""
        interfaces = list(interfaces)
        self.ready(interfaces)
        failures: List[str] = []
        for pid, name in interfaces:
            body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, self._index[(pid, name)],
                                  IFF_UP if up else 0, IFF_UP)
            try:
                self._channels[pid].request(
                    lambda seq: message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, seq, body))
            except OSError as exc:
                failures.append(f"{name} in {_where(pid)}: {exc}")
        if failures:
            raise LinkStateError(f"could not take {len(failures)} interface(s) "
                                 f"{'up' if up else 'down'}: " + "; ".join(failures))

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._index.clear()


def _index_of(name: str) -> Optional[int]:
    try:
        return socket.if_nametoindex(name)
    except OSError:
        return None


def _in_namespace(pid: Optional[int], work: Callable):
    """``work()`` in ``pid``'s network namespace (None: this one)."""
    if pid is None:
        return work()
    try:
        return in_namespace(pid, work)
    except Exception as exc:   # noqa: BLE001
        raise LinkStateError(f"cannot work in {_where(pid)}: {exc}") from None


def _where(pid: Optional[int]) -> str:
    return "the root namespace" if pid is None else f"the namespace of pid {pid}"
