"""Cyclic OCS schedules, compiled to the kernel's timed map entries.  Pure.

A rotor OCS does not wait for circuit requests: it steps through a fixed list
of matchings, one per *slot*, and starts over (RotorNet, `topologies.rotor`).
A `Schedule` is that list for every scheduled OCS, a slot length and a guard
time, repeating from an epoch::

      slot 0                 slot 1                 slot 2          slot 0 ...
    |guard|  matching 0    |guard|  matching 1    |guard|  matching 2 |guard| ...
    |dark |  lit           |dark |  lit           |dark |  lit        |dark |
    ^epoch                 ^epoch + period        ^epoch + 2 period
    <------ slot_s ------->

One slot is its guard and then its lit part (``slot_s`` includes the
guard).  The guard comes first in every slot: it is the OCS's reconfiguration
delay, spent dark *before* the slot's matching is usable, as a rotor's
mirrors move before its next matching lands; ``duty_cycle`` is the lit share,
(slot - guard) / slot.  Every OCS of a schedule has the same number of slots,
so the whole fabric changes matchings at the same instants.

Times are *real* seconds, as the source texts give them (RotorNet: a 10 us
reconfiguration); the emulator runs ``tdf`` times slower than the real
fabric (`traffic.scale`: emulated = real x tdf), so the kernel gets
``slot_s x tdf`` and ``guard_s x tdf``: a 10 us real guard becomes, at tdf
100, a 1 ms emulated window, long enough against the shaped links'
serialisation times for the dark part to be seen (and short windows are not
lost in the kernel's timer slack).

No process acts at a slot boundary.  The compilers turn a schedule into map
entries whose times the kernel enforces at each packet's arrival
(``controllers/bpf/entry.py``: a *cyclic* entry holds the epoch, the period
(one slot), the guard and, per slot, the ifindex a port leads to, 0 dark):

* `compile_ocs`: per OCS port, the peer port in each slot (the OCS's map);
* `compile_tor`: per ToR, per remote host, the uplink whose rotor joins this
  ToR to that host's ToR in each slot (the ToR's time-flow table), with no
  guard of its own: the OCS enforces the guard.

`slot_boundaries` gives the slots of a time window, for measurements that bin
traffic per slot.  `from_dict` reads a scenario's ``schedule`` table.  The
kernel's entry type is used by one function, `_kernel_entries`, at the end;
everything before it is plain data (`Cyclic`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from topologies import rotor
from topologies.fabric import EPS, OCS, Fabric, FabricError

if TYPE_CHECKING:
    from controllers.bpf.entry import Circuit

#: Slots a cyclic kernel entry holds (``controllers.bpf.entry.MAX_SLOTS``).
MAX_SLOTS = 32

Pair = Tuple[int, int]
Matching = Tuple[Pair, ...]

SCENARIO_KEYS = ("rotor", "slot_us", "guard_us", "matchings")


class ScheduleError(ValueError):
    """A schedule that cannot run on its fabric; the message names the field."""


def _ocs_key(ocs: str) -> str:
    return f"matchings[{ocs!r}]"


@dataclass(frozen=True)
class Schedule:
    """A cyclic schedule: per OCS, the matching of each slot (a tuple of
    (port, port) circuits of that OCS), repeating.

    ``slot_s``: one slot, guard included, in real seconds; ``guard_s``: the
    dark start of every slot, real seconds; ``tdf``: time dilation, emulated
    durations are real x tdf (>= 1).  `validate` checks one against a fabric.
    """

    slot_s: float
    guard_s: float
    matchings: Dict[str, Tuple[Matching, ...]]
    tdf: float = 1.0

    def __post_init__(self):
        if not isinstance(self.matchings, Mapping):
            raise ScheduleError(f"schedule.matchings: must map OCS names to slots, "
                                f"got {type(self.matchings).__name__}")
        object.__setattr__(self, "matchings", {
            ocs: tuple(_matching(slot, f"schedule.{_ocs_key(ocs)}[{k}]")
                       for k, slot in enumerate(_sequence(slots, f"schedule.{_ocs_key(ocs)}")))
            for ocs, slots in self.matchings.items()})

    @property
    def slot_emulated_s(self) -> float:
        return self.slot_s * self.tdf

    @property
    def guard_emulated_s(self) -> float:
        return self.guard_s * self.tdf

    @property
    def duty_cycle(self) -> float:
        """The lit share of a slot: (slot - guard) / slot."""
        return (self.slot_s - self.guard_s) / self.slot_s

    @property
    def slots(self) -> int:
        """Slots in one cycle (every OCS has the same count once validated)."""
        return max((len(slots) for slots in self.matchings.values()), default=0)

    @property
    def period_ns(self) -> int:
        """One emulated slot in nanoseconds: the kernel entries' period."""
        return round(self.slot_emulated_s * 1e9)

    @property
    def guard_ns(self) -> int:
        return round(self.guard_emulated_s * 1e9)

    @property
    def cycle_emulated_s(self) -> float:
        return self.slot_emulated_s * self.slots

    def to_dict(self) -> dict:
        return {"slot_s": self.slot_s, "guard_s": self.guard_s, "tdf": self.tdf,
                "slots": self.slots, "duty_cycle": self.duty_cycle,
                "matchings": {ocs: [[list(pair) for pair in slot] for slot in slots]
                              for ocs, slots in self.matchings.items()}}


def _sequence(value, where: str) -> list:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise ScheduleError(f"{where}: must be a list, got {value!r}")
    return list(value)


def _port(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{where}: a port must be an integer, got {value!r}")
    return int(value)


def _matching(slot, where: str) -> Matching:
    pairs = []
    for i, pair in enumerate(_sequence(slot, where)):
        if isinstance(pair, (str, bytes, Mapping)) or not isinstance(pair, Sequence) \
                or len(pair) != 2:
            raise ScheduleError(f"{where}[{i}]: a circuit is a [port, port] pair, got {pair!r}")
        pairs.append((_port(pair[0], f"{where}[{i}]"), _port(pair[1], f"{where}[{i}]")))
    return tuple(pairs)


def _finite(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ScheduleError(f"{where}: must be a finite number, got {value!r}")
    return float(value)


# ---------------------------------------------------------------- validation
def validate(schedule: Schedule, fabric: Fabric, where: str = "schedule") -> Schedule:
    """Raise `ScheduleError`, naming the field, unless ``schedule`` runs on
    ``fabric``; returns it.  ``where`` prefixes the field names."""
    tdf = _finite(schedule.tdf, f"{where}.tdf")
    if tdf < 1:
        raise ScheduleError(f"{where}.tdf: must be >= 1 (emulated = real x tdf), got {tdf:g}")
    slot = _finite(schedule.slot_s, f"{where}.slot_s")
    if slot <= 0:
        raise ScheduleError(f"{where}.slot_s: must be > 0, got {slot:g}")
    guard = _finite(schedule.guard_s, f"{where}.guard_s")
    if not 0 <= guard < slot:
        raise ScheduleError(f"{where}.guard_s: must be >= 0 and < slot_s ({slot:g} s), "
                            f"got {guard:g}")
    if schedule.period_ns < 1 or schedule.guard_ns >= schedule.period_ns:
        raise ScheduleError(f"{where}.slot_s: {slot:g} s x tdf {tdf:g} is "
                            f"{schedule.period_ns} ns with a {schedule.guard_ns} ns guard; "
                            "the kernel needs a slot of at least 1 ns longer than its guard")
    if not schedule.matchings:
        raise ScheduleError(f"{where}.matchings: empty; give at least one OCS's slots "
                            f"(OCS here: {', '.join(fabric.ocs_switches) or 'none'})")
    first: Optional[Tuple[str, int]] = None
    for ocs, slots in schedule.matchings.items():
        field = f"{where}.{_ocs_key(ocs)}"
        if ocs not in fabric.graph or fabric.kind(ocs) != OCS:
            raise ScheduleError(f"{field}: no OCS {ocs!r} in fabric {fabric.name!r}; OCS here: "
                                f"{', '.join(fabric.ocs_switches) or 'none'}")
        if not slots:
            raise ScheduleError(f"{field}: no slots; give 1..{MAX_SLOTS} matchings")
        if len(slots) > MAX_SLOTS:
            raise ScheduleError(f"{field}: {len(slots)} slots, more than the kernel entry's "
                                f"{MAX_SLOTS}")
        if first is None:
            first = (ocs, len(slots))
        elif len(slots) != first[1]:
            raise ScheduleError(f"{field}: {len(slots)} slots, but {first[0]!r} has {first[1]}; "
                                "every OCS of a schedule has the same number of slots")
        radix = fabric.graph.nodes[ocs]["radix"]
        for k, matching in enumerate(slots):
            used = set()
            for a, b in matching:
                if a == b:
                    raise ScheduleError(f"{field}[{k}]: circuit {a}-{b} joins port {a} to itself")
                for port in (a, b):
                    if not 1 <= port <= radix:
                        raise ScheduleError(f"{field}[{k}]: port {port} is not a port of {ocs} "
                                            f"(radix {radix}: allowed 1..{radix})")
                    if port in used:
                        raise ScheduleError(f"{field}[{k}]: port {port} is used twice")
                    used.add(port)
    return schedule


# ---------------------------------------------------------------- RotorNet
def _rotor_matchings(fabric: Fabric, where: str) -> Dict[str, Tuple[Matching, ...]]:
    if fabric.name != "rotor":
        raise ScheduleError(f"{where}: a rotor schedule needs the 'rotor' fabric, "
                            f"this is {fabric.name!r}")
    tors = fabric.params["tors"]
    pairs = rotor.matchings(tors)
    by_index = {fabric.graph.nodes[o]["rotor"]: o for o in fabric.ocs_switches}

    def slot(r: int, k: int) -> Matching:
        return tuple((rotor.tor_port(a), rotor.tor_port(b)) for a, b in pairs[(k + r) % (tors - 1)])

    return {by_index[r]: tuple(slot(r, k) for k in range(tors - 1)) for r in sorted(by_index)}


def rotor_schedule(fabric: Fabric, slot_s: float, guard_s: float, tdf: float = 1.0) -> Schedule:
    """RotorNet's schedule on the `topologies.rotor` fabric: ``tors - 1`` slots;
    rotor r in slot k is lit with matching (k + r) mod (tors - 1) of
    `topologies.rotor.matchings` (ToR t on port t + 1).  Slot 0 is the
    fabric's initial circuits, and with ``tors - 1`` rotors every ToR pair is
    joined by exactly one rotor in every slot."""
    return validate(Schedule(slot_s, guard_s, _rotor_matchings(fabric, "rotor_schedule"), tdf),
                    fabric)


# ---------------------------------------------------------------- compiling
@dataclass(frozen=True)
class Cyclic:
    """One cyclic kernel entry as plain data: from ``epoch_ns`` (CLOCK_MONOTONIC),
    slot i of every cycle lasts ``period_ns``, its first ``guard_ns`` dark, then
    leads to ifindex ``peers[i]`` (0: dark the whole slot)."""

    epoch_ns: int
    period_ns: int
    guard_ns: int
    peers: Tuple[int, ...]


def _ifindex(ifindexes: Mapping[str, Mapping[int, int]], node: str, port: int) -> int:
    try:
        return int(ifindexes[node][port])
    except KeyError:
        raise ScheduleError(f"ifindexes[{node!r}]: no ifindex for port {port}") from None


def _peer_ports(matching: Matching) -> Dict[int, int]:
    peers = {}
    for a, b in matching:
        peers[a], peers[b] = b, a
    return peers


def ocs_plan(schedule: Schedule, ifindexes: Mapping[str, Mapping[int, int]],
             epoch_ns: int) -> Dict[str, Dict[int, Cyclic]]:
    """`compile_ocs` as plain data: OCS -> port ifindex -> `Cyclic`."""
    period, guard = schedule.period_ns, schedule.guard_ns
    result: Dict[str, Dict[int, Cyclic]] = {}
    for ocs, slots in schedule.matchings.items():
        if ocs not in ifindexes:
            raise ScheduleError(f"ifindexes: no ports of {ocs!r}")
        by_slot = [_peer_ports(matching) for matching in slots]
        ports = sorted(set(ifindexes[ocs]) | {p for peers in by_slot for p in peers})
        result[ocs] = {
            _ifindex(ifindexes, ocs, port): Cyclic(
                int(epoch_ns), period, guard,
                tuple(_ifindex(ifindexes, ocs, peers[port]) if port in peers else 0
                      for peers in by_slot))
            for port in ports}
    return result


def _uplinks(schedule: Schedule, fabric: Fabric) -> Dict[str, List[Tuple[int, str, int]]]:
    """Packet switch -> its (port, OCS, OCS port) toward the scheduled OCSes."""
    result: Dict[str, List[Tuple[int, str, int]]] = {}
    for ocs in schedule.matchings:
        for ocs_port, (node, node_port) in fabric.ports_of(ocs).items():
            if fabric.kind(node) == EPS:
                result.setdefault(node, []).append((node_port, ocs, ocs_port))
    order = {name: i for i, name in enumerate(fabric.eps_switches)}
    return {tor: sorted(result[tor]) for tor in sorted(result, key=order.__getitem__)}


def _host_switches(fabric: Fabric) -> Dict[str, str]:
    """Host -> the packet switch it hangs off (hosts on an OCS or multi-homed: none)."""
    result = {}
    for host in fabric.hosts:
        try:
            switch, _ = fabric.host_port(host)
        except FabricError:
            continue
        if fabric.kind(switch) == EPS:
            result[host] = switch
    return result


def tor_plan(schedule: Schedule, fabric: Fabric, ifindexes: Mapping[str, Mapping[int, int]],
             epoch_ns: int) -> Dict[str, Dict[str, Cyclic]]:
    """`compile_tor` as plain data: ToR -> remote host's IPv4 address -> `Cyclic`.

    peers[k] is the ifindex of this ToR's uplink whose OCS, in slot k, joins it
    to the host's ToR (the lowest such port if several do; 0 if none)."""
    period = schedule.period_ns
    wired = {ocs: fabric.ports_of(ocs) for ocs in schedule.matchings}
    peers_at = {ocs: [_peer_ports(m) for m in slots] for ocs, slots in schedule.matchings.items()}
    hosts = _host_switches(fabric)
    result: Dict[str, Dict[str, Cyclic]] = {}
    for tor, uplinks in _uplinks(schedule, fabric).items():
        table: Dict[str, Cyclic] = {}
        for host, home in hosts.items():
            if home == tor:
                continue
            peers = []
            for k in range(schedule.slots):
                chosen = 0
                for port, ocs, ocs_port in uplinks:
                    far = peers_at[ocs][k].get(ocs_port)
                    if far is not None and far in wired[ocs] and wired[ocs][far][0] == home:
                        chosen = _ifindex(ifindexes, tor, port)
                        break
                peers.append(chosen)
            table[fabric.graph.nodes[host]["ip"]] = Cyclic(int(epoch_ns), period, 0, tuple(peers))
        result[tor] = table
    return result


def slot_boundaries(epoch_ns: int, period_ns: int, guard_ns: int, start_ns: int,
                    end_ns: int) -> List[Tuple[int, int, int]]:
    """(slot index, lit_from_ns, dark_from_ns) of every slot that overlaps
    [start_ns, end_ns) and starts at or after the epoch (before it the ports
    are dark).  Slot n is dark from ``epoch + n x period`` (its guard), lit
    from ``lit_from`` and dark again from ``dark_from`` (the next slot's
    guard); n counts from the epoch, so its matching is n mod the schedule's
    slots.  Times are not clipped to the window."""
    if period_ns <= 0:
        raise ScheduleError(f"slot_boundaries: period_ns must be > 0, got {period_ns}")
    if not 0 <= guard_ns < period_ns:
        raise ScheduleError(f"slot_boundaries: guard_ns must be >= 0 and < period_ns "
                            f"({period_ns}), got {guard_ns}")
    if end_ns <= start_ns:
        return []
    first = max(0, (start_ns - epoch_ns) // period_ns)
    result = []
    n = first
    while epoch_ns + n * period_ns < end_ns:
        begin = epoch_ns + n * period_ns
        if begin + period_ns > start_ns:
            result.append((n, begin + guard_ns, begin + period_ns))
        n += 1
    return result


# ---------------------------------------------------------------- scenario data
def _us(data: Mapping, key: str, where: str) -> float:
    if key not in data:
        raise ScheduleError(f"{where}.{key}: missing (microseconds, real time)")
    return _finite(data[key], f"{where}.{key}")


def _parse_matchings(value, where: str) -> Dict[str, Tuple[Matching, ...]]:
    field = f"{where}.matchings"
    if not isinstance(value, Mapping) or not value:
        raise ScheduleError(f"{field}: must be a non-empty table of OCS name -> list of slots, "
                            "each a list of [port, port] circuits, e.g. "
                            "{o1 = [[[1, 2], [3, 4]], [[1, 3], [2, 4]]]}; got "
                            f"{value!r}")
    result = {}
    for ocs, slots in value.items():
        key = f"{where}.{_ocs_key(ocs)}"
        result[str(ocs)] = tuple(_matching(slot, f"{key}[{k}]")
                                 for k, slot in enumerate(_sequence(slots, key)))
    return result


def from_dict(data: Mapping, fabric: Fabric, tdf: float, where: str) -> Schedule:
    """A schedule from scenario data, validated against ``fabric``.

    Either ``{"rotor": true, "slot_us": .., "guard_us": ..}`` (`rotor_schedule`)
    or ``{"slot_us": .., "guard_us": .., "matchings": {"o1": [[[1, 2], [3, 4]],
    ...]}}``; slot and guard in real microseconds.  Errors name ``where`` and
    the key."""
    allowed = ", ".join(SCENARIO_KEYS)
    if not isinstance(data, Mapping):
        raise ScheduleError(f"{where}: must be a table with keys {allowed}, got {data!r}")
    unknown = sorted(str(key) for key in set(data) - set(SCENARIO_KEYS))
    if unknown:
        raise ScheduleError(f"{where}: unknown key {unknown[0]!r}; allowed: {allowed}")
    slot_us = _us(data, "slot_us", where)
    if slot_us <= 0:
        raise ScheduleError(f"{where}.slot_us: must be > 0, got {slot_us:g}")
    guard_us = _us(data, "guard_us", where)
    if not 0 <= guard_us < slot_us:
        raise ScheduleError(f"{where}.guard_us: must be >= 0 and < slot_us ({slot_us:g}), "
                            f"got {guard_us:g}")
    rotor = data.get("rotor", False)
    if not isinstance(rotor, bool):
        raise ScheduleError(f"{where}.rotor: must be true or false, got {rotor!r}")
    if rotor and "matchings" in data:
        raise ScheduleError(f"{where}: give rotor = true or matchings, not both")
    if rotor:
        matchings = _rotor_matchings(fabric, f"{where}.rotor")
    elif "matchings" in data:
        matchings = _parse_matchings(data["matchings"], where)
    else:
        raise ScheduleError(f"{where}: give rotor = true (the rotor fabric's schedule) or "
                            f"matchings (per OCS, a list of slots); allowed keys: {allowed}")
    return validate(Schedule(slot_us / 1e6, guard_us / 1e6, matchings, tdf), fabric, where)


# ---------------------------------------------------------------- kernel entries
def compile_ocs(schedule: Schedule, ifindexes: Mapping[str, Mapping[int, int]],
                epoch_ns: int) -> Dict[str, Dict[int, "Circuit"]]:
    """Per scheduled OCS, per port's ifindex (``ifindexes[ocs][port]``), its
    cyclic kernel entry: period one emulated slot, guard the emulated guard
    (ns), peers[i] the ifindex of the port it is joined to in slot i, 0 if
    unmatched.  Other nodes of ``ifindexes`` are left alone."""
    return {ocs: _kernel_entries(entries)
            for ocs, entries in ocs_plan(schedule, ifindexes, epoch_ns).items()}


def compile_tor(schedule: Schedule, fabric: Fabric, ifindexes: Mapping[str, Mapping[int, int]],
                epoch_ns: int) -> Dict[str, Dict[int, "Circuit"]]:
    """The ToRs' time-flow tables: per ToR wired to a scheduled OCS, keyed by
    ``ipv4_key`` of every host on another ToR, a cyclic entry (same epoch and
    period as the OCSes', guard 0) whose peers[k] is the uplink to take in
    slot k (see `tor_plan`)."""
    return {tor: _kernel_entries(entries, by_address=True)
            for tor, entries in tor_plan(schedule, fabric, ifindexes, epoch_ns).items()}


def _kernel_entries(plan: Mapping, by_address: bool = False) -> Dict[int, "Circuit"]:
    """Plain `Cyclic` entries as ``controllers.bpf.entry`` entries (the one place
    that imports it); keys that are IPv4 addresses become ``ipv4_key``."""
    from controllers.bpf import entry

    if any(len(c.peers) > entry.MAX_SLOTS for c in plan.values()):
        raise ScheduleError(f"schedule: more slots than the kernel entry's {entry.MAX_SLOTS}")
    return {(entry.ipv4_key(key) if by_address else key):
            entry.cyclic(c.epoch_ns, c.period_ns, c.guard_ns, list(c.peers))
            for key, c in plan.items()}
