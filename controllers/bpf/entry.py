"""A circuit as the kernel's patch panel reads it: one map entry, with its times.

The BPF programs (``panel.bpf.c``) look a port (or a destination) up and ask
the entry where frames go *now*, on the kernel's CLOCK_MONOTONIC, so an entry
carries the future of a circuit rather than its present state:

- timed: lit to ``peer_now`` until ``dark_at``, dark, then lit to
  ``peer_next`` from ``lit_at`` (a reconfiguration in one write);
- arming: a timed entry whose ``dark_at`` and ``lit_at`` are offsets from
  the moment the kernel's ``arm`` program anchors them (``peer_now`` stays
  lit until then): how a reconfiguration is written, so that a late
  controller moves its window but never shortens it;
- cyclic: from ``epoch`` on, slot ``k`` (``period`` ns, of which the first
  ``guard`` ns are dark) is lit to ``peers[k % nslots]`` (a rotor schedule);
  before ``epoch`` its timed fields hold, so a schedule written ahead of time
  leaves the present circuit lit until it starts.

The entry is packed here to the C struct's bytes (``ENTRY``: 184 bytes, no
padding; field order and sizes are an ABI shared with ``panel.bpf.c``), and
`peer_at` mirrors the C function line for line, so that a controller can say
what the kernel will do and the unit tests can compare the two.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, fields
from typing import Sequence, Tuple

MAX_SLOTS = 32
FOREVER = 2**64 - 1            # a time that never comes: U64_MAX in the C program
TIMED, CYCLIC, ARMING = 0, 1, 2

# mode, nslots, peer_now, peer_next, dark_at, lit_at, epoch, period, guard, peers
ENTRY = struct.Struct("=IIIIQQQQQ32I")
assert ENTRY.size == 184, "struct circuit is 184 bytes in panel.bpf.c"

_U32, _U64 = 2**32 - 1, 2**64 - 1


def _unsigned(name: str, value, limit: int) -> int:
    # bool is an int to Python, but True as an ifindex or a time is a bug.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= limit:
        raise ValueError(f"{name} must be in 0..{limit}, not {value}")
    return value


@dataclass(frozen=True)
class Circuit:
    """One ``struct circuit``; the defaults make a dark one.

    ``peers`` always holds ``MAX_SLOTS`` ifindexes (shorter tuples are padded
    with 0), so that an entry and its unpacked bytes compare equal."""

    mode: int = TIMED
    nslots: int = 0
    peer_now: int = 0
    peer_next: int = 0
    dark_at: int = FOREVER
    lit_at: int = FOREVER
    epoch: int = 0
    period: int = 0
    guard: int = 0
    peers: Tuple[int, ...] = ()

    def __post_init__(self):
        # Checked here rather than left to struct.pack, so a bad value names
        # its field when the entry is made, not when it is written.
        for name in ("mode", "nslots", "peer_now", "peer_next"):
            _unsigned(name, getattr(self, name), _U32)
        for name in ("dark_at", "lit_at", "epoch", "period", "guard"):
            _unsigned(name, getattr(self, name), _U64)
        if self.mode not in (TIMED, CYCLIC, ARMING):
            raise ValueError(f"mode must be {TIMED} (timed), {CYCLIC} (cyclic) or {ARMING} "
                             f"(arming), not {self.mode}")
        if self.nslots > MAX_SLOTS:
            raise ValueError(f"nslots must be at most {MAX_SLOTS}, not {self.nslots}")
        peers = tuple(self.peers)
        if len(peers) > MAX_SLOTS:
            raise ValueError(f"at most {MAX_SLOTS} peers, not {len(peers)}")
        for i, peer in enumerate(peers):
            _unsigned(f"peers[{i}]", peer, _U32)
        object.__setattr__(self, "peers", peers + (0,) * (MAX_SLOTS - len(peers)))

    def pack(self) -> bytes:
        """The entry's bytes, as the BPF program reads them."""
        return ENTRY.pack(self.mode, self.nslots, self.peer_now, self.peer_next,
                          self.dark_at, self.lit_at, self.epoch, self.period, self.guard,
                          *self.peers)

    @classmethod
    def unpack(cls, data: bytes) -> "Circuit":
        values = ENTRY.unpack(bytes(data))
        names = [f.name for f in fields(cls)][:-1]
        return cls(**dict(zip(names, values[:len(names)])), peers=values[len(names):])


def unpack(data: bytes) -> Circuit:
    """An entry read back from a map (`Circuit.unpack`)."""
    return Circuit.unpack(data)


def lit(peer: int) -> Circuit:
    """Lit to ``peer`` until further notice."""
    if _unsigned("peer", peer, _U32) == 0:
        raise ValueError("a lit circuit needs a peer ifindex (0 is none: use dark())")
    return Circuit(peer_now=peer)


def dark() -> Circuit:
    """No circuit: every frame is dropped (as if the port had no entry)."""
    return Circuit()


def timed(peer_now: int, dark_at: int, peer_next: int, lit_at: int) -> Circuit:
    """Lit to ``peer_now`` until ``dark_at``, dark, lit to ``peer_next`` from
    ``lit_at`` (CLOCK_MONOTONIC ns; 0 as a peer: dark in that part)."""
    for name, value, limit in (("peer_now", peer_now, _U32), ("dark_at", dark_at, _U64),
                               ("peer_next", peer_next, _U32), ("lit_at", lit_at, _U64)):
        _unsigned(name, value, limit)
    if lit_at < dark_at:
        raise ValueError(f"lit_at ({lit_at}) before dark_at ({dark_at}): "
                         "a circuit cannot light before the old one went dark")
    return Circuit(peer_now=peer_now, dark_at=dark_at, peer_next=peer_next, lit_at=lit_at)


def arming(peer_now: int, dark_in: int, peer_next: int, lit_in: int) -> Circuit:
    """`timed`, with ``dark_in`` and ``lit_in`` in ns from the next ``arm`` run
    (FOREVER stays FOREVER); lit to ``peer_now`` until then."""
    circuit = timed(peer_now, dark_in, peer_next, lit_in)
    return Circuit(mode=ARMING, peer_now=circuit.peer_now, dark_at=circuit.dark_at,
                   peer_next=circuit.peer_next, lit_at=circuit.lit_at)


def armed(circuit: Circuit, now: int) -> Circuit:
    """What ``arm`` makes of an arming entry at ``now`` (others are unchanged)."""
    if circuit.mode != ARMING:
        return circuit
    return Circuit(peer_now=circuit.peer_now, peer_next=circuit.peer_next,
                   dark_at=circuit.dark_at if circuit.dark_at == FOREVER
                   else circuit.dark_at + now,
                   lit_at=circuit.lit_at if circuit.lit_at == FOREVER else circuit.lit_at + now)


def cyclic(epoch: int, period: int, guard: int, peers: Sequence[int],
           before: Circuit = dark()) -> Circuit:
    """From ``epoch`` on, slot ``k`` lit to ``peers[k % len(peers)]`` after a dark
    ``guard`` (every slot is ``period`` ns, guard included).  Until ``epoch``
    the timed circuit ``before`` holds, going dark at ``epoch`` at the latest."""
    _unsigned("epoch", epoch, _U64)
    _unsigned("period", period, _U64)
    _unsigned("guard", guard, _U64)
    if not guard < period:
        raise ValueError(f"guard ({guard} ns) must be shorter than the period ({period} ns)")
    peers = tuple(peers)
    if not 1 <= len(peers) <= MAX_SLOTS:
        raise ValueError(f"a cycle has 1..{MAX_SLOTS} slots, not {len(peers)}")
    if before.mode != TIMED:
        # One entry holds one schedule: the old one cannot run on until epoch.
        raise ValueError("before must be a timed circuit (lit, dark or timed), not a cyclic one")
    return Circuit(mode=CYCLIC, nslots=len(peers), peers=peers,
                   epoch=epoch, period=period, guard=guard,
                   peer_now=before.peer_now, dark_at=min(before.dark_at, epoch),
                   peer_next=before.peer_next, lit_at=before.lit_at)


def peer_at(circuit: Circuit, now: int) -> int:
    """The ifindex ``circuit`` leads to at ``now`` (CLOCK_MONOTONIC ns), 0 when
    dark: ``peer_at`` of ``panel.bpf.c``, in Python."""
    c = circuit
    if c.mode == ARMING:
        return c.peer_now
    if c.mode == CYCLIC and now >= c.epoch:
        if c.nslots == 0 or c.period == 0:
            return 0
        off = now - c.epoch
        k = off // c.period
        if off - k * c.period < c.guard:
            return 0
        return c.peers[(k % c.nslots) & (MAX_SLOTS - 1)]
    if now < c.dark_at:
        return c.peer_now
    if now >= c.lit_at:
        return c.peer_next
    return 0


def ipv4_key(ip: str) -> int:
    """The ``dests`` key of an IPv4 address: its four bytes as they are in the
    packet, read as a native __u32 (what the program's ``ip->daddr`` is)."""
    # inet_pton, not inet_aton: "10.1" must not quietly become 10.0.0.1.
    return struct.unpack("=I", socket.inet_pton(socket.AF_INET, ip))[0]
