"""The BPF patch panel: circuits whose dark windows the kernel times.

The mirred panel (`controllers.netlink.patch`) lights and tears a circuit with
a filter change, so a dark window lasts from one netlink request to the next,
and the controller's process decides when the second one goes out: a sleep
that wakes up late makes the window longer.  Here every port of an OCS runs
one small tc program (``ocs_panel`` in ``controllers/bpf/panel.bpf.c``,
cls_bpf in direct-action mode) that looks its ingress port up in the OCS's
map and redirects the frame to the peer port, or drops it.  A map entry
carries *times* (`controllers.bpf.entry`): lit to one peer until ``dark_at``,
to another from ``lit_at``, or a cyclic schedule.  A reconfiguration is then
one map write carrying its switch times, relative to a moment the kernel
fixes: the panel's ``arm`` program, run right after the write, reads the
kernel's clock and anchors them in one pass over the map.  The kernel then
enforces them at each packet's arrival, to the nanosecond of its monotonic
clock, however late the controller's process runs before or after (written
as absolute times, they reached the map up to 7 ms late on a loaded machine,
and the window opened at the write, shorter than asked)::

      o1 (an OCS namespace)                 map "ports" of o1
    +---------------------------+          +------------------------------+
    | o1-eth1 ingress: ocs_panel|--lookup->| ifindex(o1-eth1) -> {peer 3, |
    |   redirect(peer) or SHOT  |          |   dark_at T0, peer 4, lit T1}|
    | o1-eth3 ... o1-eth4 ...   |          | ...                          |
    +---------------------------+          +------------------------------+

The filter is attached with one netlink message per port (TCA_BPF_FD names
the program by a file descriptor of this process); the maps are written
through the descriptors the loader keeps (`controllers.bpf.libbpf`), a system
call each, never a process.  Nothing is pinned: the program and its maps live
while this process holds them or a filter uses them, so a namespace deleted
or a process gone takes them along.

Messages (``include/uapi/linux/pkt_cls.h``)::

    RTM_NEWTFILTER  tcmsg{ifindex, parent ffff:, info = prio << 16 | ETH_P_ALL}
                    TCA_KIND "bpf"
                    TCA_OPTIONS { TCA_BPF_FD <program fd>, TCA_BPF_NAME "ocs_panel",
                                  TCA_BPF_FLAGS ACT_DIRECT }

The kernel's clock for packets is CLOCK_MONOTONIC (``bpf_ktime_get_ns``); the
rest of the controller speaks epoch seconds (they are laid over captures),
so `Clock` converts between the two with an offset read at start.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from typing import Dict, Iterable, Optional, Tuple

from controllers.bpf import entry as entries
from controllers.netlink.wire import (HEADER, NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE,
                                      NLM_F_EXCL, NLM_F_REQUEST, Channel, attr, message)

LOG = logging.getLogger("fabric.netlink.bpf")

RTM_NEWTFILTER, RTM_GETTFILTER = 44, 46
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS, TCA_BPF_ID = 6, 7, 8, 11
TCA_BPF_FLAG_ACT_DIRECT = 1
INGRESS_PARENT = 0xFFFF0000
ETH_P_ALL = 0x0003
_TCMSG = struct.Struct("=BxxxiIII")

OCS_PROGRAM = "ocs_panel"
HOST_PORT_PROGRAM = "tor_timeflow"
UPLINK_PROGRAM = "tor_uplink"
ARM_PROGRAM = "arm"
# How long after `arm` anchors a reconfiguration its dark window opens: the
# pass over the map takes microseconds, and every entry must be anchored
# before the first port goes dark, so that all go dark at the same instant.
DEFAULT_LEAD_S = 50e-6


def filter_add(seq: int, ifindex: int, program_fd: int, name: str, prio: int = 1) -> bytes:
    """RTM_NEWTFILTER: every frame entering ``ifindex`` goes through the program."""
    options = attr(TCA_BPF_FD, struct.pack("=I", program_fd)) + \
        attr(TCA_BPF_NAME, name.encode() + b"\0") + \
        attr(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT))
    body = _TCMSG.pack(0, ifindex, 0, INGRESS_PARENT,
                       (prio << 16) | socket.htons(ETH_P_ALL)) + \
        attr(TCA_KIND, b"bpf\0") + attr(TCA_OPTIONS, options, nested=True)
    return message(RTM_NEWTFILTER, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                   seq, body)


class PanelAttachError(OSError):
    """The kernel refused a program's filter on a port."""


class Clock:
    """Epoch seconds <-> the kernel's CLOCK_MONOTONIC nanoseconds.

    The offset is read as the narrowest of a few (epoch, monotonic, epoch)
    samples, so it is good to a microsecond or so.  Slewing moves both clocks
    alike; a step of the epoch clock during a run (settimeofday, an NTP step)
    would move the offset, and this one would not see it."""

    def __init__(self, samples: int = 20):
        best = None
        for _ in range(samples):
            before = time.time_ns()
            mono = time.monotonic_ns()
            after = time.time_ns()
            if best is None or after - before < best[0]:
                best = (after - before, (before + after) // 2 - mono)
        self.offset_ns = best[1]

    def to_epoch(self, mono_ns: int) -> float:
        return (mono_ns + self.offset_ns) / 1e9

    def to_mono(self, epoch_s: float) -> int:
        return int(round(epoch_s * 1e9)) - self.offset_ns

    @staticmethod
    def now_ns() -> int:
        return time.monotonic_ns()


def load_program(path=None):
    """Load the panel's object once (a fresh set of maps); `PanelError` if not."""
    from controllers.bpf.libbpf import PanelObject

    return PanelObject.load(path)


class _Attached:
    """A loaded object whose programs are attached to ports of one namespace."""

    def __init__(self, sock: socket.socket, obj, error=PanelAttachError):
        self.channel = Channel(sock, error)
        self.obj = obj

    def attach(self, ifindexes: Iterable[int], program: str, prio: int = 1) -> None:
        fd = self.obj.program_fd(program)
        for ifindex in ifindexes:
            self.channel.request(lambda seq, i=ifindex: filter_add(seq, i, fd, program, prio))

    def close(self) -> None:
        self.channel.close()
        self.obj.close()


# The panel's own maps, by the names the kernel reports (libbpf's internal
# maps, .rodata and the like, are the new object's own).
PANEL_MAPS = ("ports", "stats", "armed_at", "dests")


def filter_get(seq: int, ifindex: int, prio: int = 1, handle: int = 1) -> bytes:
    """RTM_GETTFILTER: the bpf filter `filter_add` attached (the kernel gives
    the first filter of a priority handle 1)."""
    body = _TCMSG.pack(0, ifindex, handle, INGRESS_PARENT,
                       (prio << 16) | socket.htons(ETH_P_ALL)) + attr(TCA_KIND, b"bpf\0")
    return message(RTM_GETTFILTER, NLM_F_REQUEST, seq, body)


def _attributes(data: bytes, offset: int, end: int) -> Dict[int, bytes]:
    found = {}
    while offset + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        found[kind & ~NLA_F_NESTED] = data[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return found


def program_of_filter(reply: bytes) -> Tuple[str, Optional[int]]:
    """(program name, program id) of an RTM_NEWTFILTER message of a bpf filter
    (pyroute2 0.9 does not decode TCA_BPF_ID)."""
    top = _attributes(reply, HEADER.size + _TCMSG.size, len(reply))
    options = _attributes(top.get(TCA_OPTIONS, b""), 0, len(top.get(TCA_OPTIONS, b"")))
    name = options.get(TCA_BPF_NAME, b"").split(b"\0")[0].decode(errors="replace")
    program_id = options.get(TCA_BPF_ID)
    return name, struct.unpack("=I", program_id[:4])[0] if program_id else None


def attached_program_id(sock: socket.socket, ifindexes: Iterable[int],
                        program: str = OCS_PROGRAM) -> Optional[int]:
    """The id of ``program`` attached to the ingress of one of ``ifindexes`` in
    the namespace of ``sock`` (a netlink socket), by a controller that may
    have died; None if none of them has it."""
    channel = Channel(sock)
    for ifindex in ifindexes:
        try:
            reply = channel.request(lambda seq, i=ifindex: filter_get(seq, i))
        except OSError:       # no ingress qdisc, or no filter on this port
            continue
        if reply is not None:
            name, program_id = program_of_filter(reply)
            if name == program and program_id is not None:
                return program_id
    return None


def take_over_program(program_id: int):
    """A panel object over the maps of a dead controller's attached program:
    its programs see the same circuits, and writes here change them."""
    from controllers.bpf.libbpf import PanelObject, maps_of_program

    fds = maps_of_program(program_id)
    try:
        return PanelObject.load(reuse={name: fd for name, fd in fds.items()
                                       if name in PANEL_MAPS})
    finally:
        for fd in fds.values():
            os.close(fd)


class BpfPatchPanel(_Attached):
    """One OCS's circuits in its map; a drop-in for `PatchSocket` (``light``,
    ``dark``), plus `timed` (a reconfiguration with its switch times) and
    `schedule` (cyclic entries).  `attach` runs after the OCS's ports got an
    empty ingress qdisc (the applier's reset)."""

    kernel_timed = True
    kind = "bpf"

    def __init__(self, sock: socket.socket, obj=None, clock: Optional[Clock] = None,
                 taken_over: bool = False):
        super().__init__(sock, obj if obj is not None else load_program())
        self.ports = self.obj.map("ports")
        self.clock = clock or Clock()
        # Over a dead controller's maps, whose program stays attached: a
        # resync rewrites entries in place, and attaches nothing.
        self.taken_over = taken_over

    def attach_ports(self, ifindexes: Iterable[int]) -> None:
        """Every port dark (no entry), then the program on each one's ingress."""
        self.ports.clear()
        self.attach(ifindexes, OCS_PROGRAM)

    def _written(self, write) -> Tuple[float, float]:
        before = time.time()
        write()
        return before, time.time()

    def light(self, ifindex: int, peer: int, prio: int = 1) -> Tuple[float, float]:
        return self._written(lambda: self.ports.update(ifindex, entries.lit(peer).pack()))

    def dark(self, ifindex: int, prio: int = 1) -> Tuple[float, float]:
        return self._written(lambda: self.ports.delete(ifindex))

    def timed(self, changes: Dict[int, "entries.Circuit"]) -> int:
        """Write a reconfiguration's arming entries (`entries.arming`) in one map
        update, then anchor them with ``arm``; returns the kernel's time
        (CLOCK_MONOTONIC ns) they were anchored on."""
        from controllers.bpf.libbpf import run_syscall

        self.ports.update_many([(ifindex, circuit.pack())
                                for ifindex, circuit in sorted(changes.items())])
        run_syscall(self.obj.program_fd(ARM_PROGRAM))
        return int.from_bytes(self.obj.map("armed_at").lookup(0), "little")

    def schedule(self, changes: Dict[int, "entries.Circuit"]) -> Tuple[float, float]:
        """Write cyclic entries (absolute times: a schedule starts far enough
        ahead); the epoch times around the write."""
        items = [(ifindex, circuit.pack()) for ifindex, circuit in sorted(changes.items())]
        return self._written(lambda: self.ports.update_many(items))

    def entry(self, ifindex: int) -> Optional["entries.Circuit"]:
        data = self.ports.lookup(ifindex)
        return None if data is None else entries.unpack(data)

    def stats(self) -> dict:
        from controllers.bpf.libbpf import stats

        return stats(self.obj.map("stats"))


class TimeflowTable(_Attached):
    """A ToR's time-flow table: which uplink each remote host is reached by, per
    slot of a rotor schedule (``tor_timeflow`` on its host ports), and a guard
    on its uplinks that drops frames a rotor delivered to the wrong ToR
    (``tor_uplink``).  Only attached when a schedule is set."""

    def __init__(self, sock: socket.socket, obj=None):
        super().__init__(sock, obj if obj is not None else load_program())
        self.dests = self.obj.map("dests")

    def write(self, changes: Dict[int, "entries.Circuit"]) -> None:
        self.dests.clear()
        self.dests.update_many([(key, circuit.pack())
                                for key, circuit in sorted(changes.items())])
