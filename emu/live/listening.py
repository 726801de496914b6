"""Who listens on a non-loopback address in this machine's root namespace.

Nothing the testbed starts may accept connections from the network a
server sits on: the controller's OpenFlow port, the web view, the control
channel and the cluster's ``ssh -R`` forwards are all on 127.0.0.1 or a Unix
socket, and what listens on a host's address (iperf3 servers, peer agents,
probe sinks) lives in that host's network namespace, where only the
emulated fabric reaches it.  sshd, which the user runs, is the exception.
This module checks that from the kernel's own tables, so a test can assert it
after a testbed started::

    from emu.live import listening

    with Testbed(fabric, scale, run_dir) as bed:
        found = listening.non_loopback_listeners(listening.our_pids())
        assert not found, listening.describe(found)

``/proc/self/net/{tcp,tcp6,udp,udp6}`` list the sockets of the reading
process's network namespace (the root one for the runner), one per line,
with the socket's inode; ``/proc/<pid>/fd/*`` links to ``socket:[inode]``
tie each to the processes holding it.  A socket of a host's namespace is in
that namespace's tables, not these, so an iperf3 server on a host's address
is never reported.  A listening TCP socket (state ``0A``) and an
unconnected bound UDP socket (state ``07``) accept from anyone; a UDP
socket connected to one peer (state ``01``) is not counted.

Parsing is pure (`parse_table`: the text in, sockets out); reading ``/proc``
is separate, so the tests feed both IPv4 and IPv6 text and a fake ``/proc``.
On another server (cluster mode) the same functions run there, over that
server's agent.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set

TABLES = ("tcp", "tcp6", "udp", "udp6")
TCP_LISTEN = 0x0A
UDP_UNCONNECTED = 0x07          # TCP_CLOSE: bound, not connected to one peer


@dataclass(frozen=True)
class Socket:
    """One socket of a ``/proc/net`` table."""

    table: str          # tcp, tcp6, udp or udp6
    address: str        # local address, as ipaddress prints it
    port: int
    state: int
    inode: int

    @property
    def listening(self) -> bool:
        """Accepts from any peer: a listening TCP socket, or a bound UDP socket
        that is not connected to one peer."""
        wanted = TCP_LISTEN if self.table.startswith("tcp") else UDP_UNCONNECTED
        return self.state == wanted and self.port != 0

    @property
    def loopback(self) -> bool:
        """Bound to 127.0.0.0/8 or ::1 (or ::ffff:127.x): reachable from this
        machine only.  The wildcards 0.0.0.0 and :: are not."""
        ip = ipaddress.ip_address(self.address)
        mapped = getattr(ip, "ipv4_mapped", None)
        return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@dataclass
class Listener:
    """A non-loopback listening socket and the processes that hold it."""

    socket: Socket
    pids: Set[int] = field(default_factory=set)
    names: Dict[int, str] = field(default_factory=dict)    # pid -> command name

    def __str__(self) -> str:
        owners = ", ".join(f"{self.names.get(pid, '?')} (pid {pid})"
                           for pid in sorted(self.pids)) or "no process (the kernel's)"
        host = f"[{self.socket.address}]" if ":" in self.socket.address \
            else self.socket.address
        return f"{self.socket.table} {host}:{self.socket.port} held by {owners}"


# ---------------------------------------------------------------- parsing
def hex_address(text: str, byteorder: str = sys.byteorder) -> str:
    """An address as ``/proc/net`` prints it: 8 hex digits (IPv4) or 32 (IPv6),
    each 32-bit word printed as the kernel holds it in memory, i.e. in the host's
    byte order (``0100007F`` is 127.0.0.1 on x86)."""
    order = "<" if byteorder == "little" else ">"
    if len(text) not in (8, 32):
        raise ValueError(f"not a /proc/net address: {text!r}")
    packed = b"".join(struct.pack(f"{order}I", int(text[i:i + 8], 16))
                      for i in range(0, len(text), 8))
    return str(ipaddress.ip_address(packed))


def parse_table(text: str, table: str, byteorder: str = sys.byteorder) -> List[Socket]:
    """Every socket of one ``/proc/net/<table>`` text (its header line skipped)."""
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; one of {', '.join(TABLES)}")
    sockets = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        address, port = fields[1].rsplit(":", 1)
        sockets.append(Socket(table=table, address=hex_address(address, byteorder),
                              port=int(port, 16), state=int(fields[3], 16),
                              inode=int(fields[9])))
    return sockets


def socket_inode(link: str) -> Optional[int]:
    """The inode of an fd link's target ``socket:[12345]``; None for anything else."""
    if link.startswith("socket:[") and link.endswith("]"):
        try:
            return int(link[len("socket:["):-1])
        except ValueError:
            return None
    return None


# ---------------------------------------------------------------- reading /proc
def read_sockets(net_dir: str = "/proc/self/net") -> List[Socket]:
    """The sockets of the namespace ``net_dir`` belongs to (tables missing
    there, e.g. tcp6 without IPv6, are skipped)."""
    sockets: List[Socket] = []
    for table in TABLES:
        try:
            with open(os.path.join(net_dir, table)) as stream:
                text = stream.read()
        except OSError:
            continue
        sockets += parse_table(text, table)
    return sockets


def socket_owners(pids: Optional[Iterable[int]] = None,
                  proc: str = "/proc") -> Dict[int, Set[int]]:
    """Socket inode -> the pids holding it, from ``<proc>/<pid>/fd`` links; every
    process when ``pids`` is None.  A process that ended, or whose fds cannot be
    read, holds nothing."""
    if pids is None:
        pids = [int(entry) for entry in _listdir(proc) if entry.isdigit()]
    owners: Dict[int, Set[int]] = {}
    for pid in pids:
        fd_dir = os.path.join(proc, str(pid), "fd")
        for fd in _listdir(fd_dir):
            try:
                inode = socket_inode(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue        # closed meanwhile
            if inode is not None:
                owners.setdefault(inode, set()).add(int(pid))
    return owners


def _listdir(path: str) -> List[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def command_name(pid: int, proc: str = "/proc") -> str:
    try:
        with open(os.path.join(proc, str(pid), "comm")) as stream:
            return stream.read().strip()
    except OSError:
        return "?"


# ---------------------------------------------------------------- the audit
def exposed(sockets: Iterable[Socket]) -> List[Socket]:
    """The listening sockets that are not bound to loopback, in table order."""
    return [s for s in sockets if s.listening and not s.loopback]


def non_loopback_listeners(pids: Iterable[int], net_dir: str = "/proc/self/net",
                           proc: str = "/proc") -> List[Listener]:
    """Sockets that ``pids`` hold and that accept from the network: listening
    (TCP) or bound and unconnected (UDP), on any address but 127.0.0.0/8 and
    ::1 (the wildcards 0.0.0.0 and :: included), in ``net_dir``'s namespace
    (the caller's by default: run it from the runner, in the root namespace).
    Give it `our_pids()`: the testbed's processes and their descendants."""
    wanted = {int(pid) for pid in pids}
    owners = socket_owners(wanted, proc)
    found = []
    for sock in exposed(read_sockets(net_dir)):
        holders = owners.get(sock.inode, set()) & wanted
        if holders:
            found.append(Listener(sock, holders,
                                  {pid: command_name(pid, proc) for pid in holders}))
    return found


def kernel_listeners(net_dir: str = "/proc/self/net", proc: str = "/proc") -> List[Listener]:
    """Exposed sockets no process holds: the kernel's own, such as a VXLAN
    device's UDP port, which Linux binds on the wildcard address of the
    namespace the device was made in.  (Reading every process's fds needs
    root; without it, sockets of other users' processes show up here too.)"""
    owners = socket_owners(None, proc)
    return [Listener(sock) for sock in exposed(read_sockets(net_dir))
            if sock.inode == 0 or sock.inode not in owners]


def our_pids(include_self: bool = True) -> Set[int]:
    """The testbed's processes on this machine: every pid `emu.live.state`
    recorded that is still the process it recorded (same start time), the
    runner itself with ``include_self``, and all their descendants (an iperf3
    an agent forked, a shell's children)."""
    import psutil

    from emu.live import state

    roots = {entry["pid"] for entry in state.owned_pids()
             if entry.get("start") is not None
             and state.process_start_time(entry["pid"]) == entry["start"]}
    if include_self:
        roots.add(os.getpid())
    found: Set[int] = set()
    for pid in roots:
        try:
            process = psutil.Process(pid)
            found.add(pid)
            found.update(child.pid for child in process.children(recursive=True))
        except psutil.Error:
            continue        # gone since it was recorded
    return found


def describe(listeners: Sequence[Listener]) -> str:
    """One line per listener, for an assertion's message."""
    if not listeners:
        return "nothing listens on a non-loopback address"
    return "listening on a non-loopback address in the root namespace:\n" + \
        "\n".join(f"  {listener}" for listener in listeners)
