"""Cyclic OCS schedules: validation, RotorNet's schedule, the compilers to kernel
entries (OCS ports and ToR time-flow tables), slot boundaries, scenario data."""

from collections import Counter
from itertools import combinations

import pytest

from controllers.bpf import entry
from controllers.schedule import (MAX_SLOTS, Cyclic, Schedule, ScheduleError, compile_ocs,
                                  compile_tor, from_dict, ocs_plan, rotor_schedule,
                                  slot_boundaries, tor_plan, validate)
from topologies import registry, rotor

RING4 = ((1, 2), (3, 4))          # hybrid (2 ToRs x 2 uplinks): o1 ports 1-2 s1, 3-4 s2


def hybrid():
    return registry.build("hybrid")


def ocs_indexes(fabric):
    """node -> port -> a made-up ifindex, distinct over the whole fabric (1000 x node + port)."""
    return {node: {port: 1000 * (i + 1) + port for port in fabric.ports_of(node)}
            for i, node in enumerate(fabric.graph.nodes) if fabric.kind(node) != "host"}


# ------------------------------------------------------------------ the dataclass
def test_times_are_real_and_dilated_by_tdf():
    schedule = Schedule(slot_s=100e-6, guard_s=10e-6, matchings={"o1": [RING4, [[1, 3]]]},
                        tdf=50.0)
    assert schedule.matchings == {"o1": (((1, 2), (3, 4)), ((1, 3),))}
    assert schedule.slot_emulated_s == pytest.approx(5e-3)
    assert schedule.guard_emulated_s == pytest.approx(0.5e-3)
    assert (schedule.period_ns, schedule.guard_ns) == (5_000_000, 500_000)
    assert schedule.duty_cycle == pytest.approx(0.9)
    assert schedule.slots == 2
    assert schedule.cycle_emulated_s == pytest.approx(10e-3)
    assert schedule.to_dict()["matchings"] == {"o1": [[[1, 2], [3, 4]], [[1, 3]]]}
    assert validate(schedule, hybrid()) is schedule


# ------------------------------------------------------------------ validation
def rotor_matchings(**changes):
    fabric = registry.build("rotor")
    matchings = {o: list(s) for o, s in rotor_schedule(fabric, 1e-4, 1e-5).matchings.items()}
    matchings.update(changes)
    return fabric, matchings


@pytest.mark.parametrize("slot_s, guard_s, matchings, tdf, message", [
    (1e-4, 1e-5, {"o2": [RING4, RING4, ((1, 2), (2, 3))]}, 1.0,
     r"^schedule\.matchings\['o2'\]\[2\]: port 2 is used twice$"),
    (1e-4, 1e-5, {"o1": [((1, 5),)] * 3}, 1.0,
     r"^schedule\.matchings\['o1'\]\[0\]: port 5 is not a port of o1 \(radix 4: allowed 1\.\.4\)$"),
    (1e-4, 1e-5, {"o1": [RING4, ((0, 2),), RING4]}, 1.0,
     r"^schedule\.matchings\['o1'\]\[1\]: port 0 is not a port of o1"),
    (1e-4, 1e-5, {"o3": [RING4, RING4, ((3, 3),)]}, 1.0,
     r"^schedule\.matchings\['o3'\]\[2\]: circuit 3-3 joins port 3 to itself$"),
    (0.0, 0.0, {}, 1.0, r"^schedule\.slot_s: must be > 0, got 0$"),
    (-1e-4, 0.0, {}, 1.0, r"^schedule\.slot_s: must be > 0, got -0\.0001$"),
    (1e-4, 1e-4, {}, 1.0, r"^schedule\.guard_s: must be >= 0 and < slot_s \(0\.0001 s\), "
                          r"got 0\.0001$"),
    (1e-4, 2e-4, {}, 1.0, r"^schedule\.guard_s: must be >= 0 and < slot_s"),
    (1e-4, -1e-6, {}, 1.0, r"^schedule\.guard_s: must be >= 0 and < slot_s"),
    (1e-4, 1e-5, {}, 0.5, r"^schedule\.tdf: must be >= 1 \(emulated = real x tdf\), got 0\.5$"),
    (1e-4, 1e-5, {"o9": [RING4]}, 1.0,
     r"^schedule\.matchings\['o9'\]: no OCS 'o9' in fabric 'rotor'; OCS here: o1, o2, o3$"),
    (1e-4, 1e-5, {"s1": [RING4]}, 1.0, r"^schedule\.matchings\['s1'\]: no OCS 's1'"),
    (1e-4, 1e-5, {"o2": [RING4] * 2}, 1.0,
     r"^schedule\.matchings\['o2'\]: 2 slots, but 'o1' has 3; every OCS of a schedule has the "
     r"same number of slots$"),
    (1e-4, 1e-5, {"o1": [RING4] * (MAX_SLOTS + 1)}, 1.0,
     r"^schedule\.matchings\['o1'\]: 33 slots, more than the kernel entry's 32$"),
    (1e-4, 1e-5, {"o1": []}, 1.0, r"^schedule\.matchings\['o1'\]: no slots; give 1\.\.32"),
    (1e-12, 0.0, {}, 1.0, r"^schedule\.slot_s: 1e-12 s x tdf 1 is 0 ns"),
])
def test_validation_names_the_field(slot_s, guard_s, matchings, tdf, message):
    fabric, full = rotor_matchings(**matchings)
    with pytest.raises(ScheduleError, match=message):
        validate(Schedule(slot_s, guard_s, full, tdf), fabric)


def test_validation_of_empty_matchings_and_of_malformed_circuits():
    fabric = registry.build("rotor")
    with pytest.raises(ScheduleError, match=r"^schedule\.matchings: empty; give at least one "
                                            r"OCS's slots \(OCS here: o1, o2, o3\)$"):
        validate(Schedule(1e-4, 1e-5, {}), fabric)
    with pytest.raises(ScheduleError, match=r"^schedule\.matchings\['o1'\]\[0\]\[1\]: a circuit "
                                            r"is a \[port, port\] pair, got \[1, 2, 3\]$"):
        Schedule(1e-4, 1e-5, {"o1": [[[3, 4], [1, 2, 3]]]})
    with pytest.raises(ScheduleError, match=r"\['o1'\]\[0\]\[0\]: a port must be an integer, "
                                            r"got True"):
        Schedule(1e-4, 1e-5, {"o1": [[[True, 2]]]})
    with pytest.raises(ScheduleError, match=r"^schedule\.matchings\['o1'\]: must be a list"):
        Schedule(1e-4, 1e-5, {"o1": "1-2"})
    assert isinstance(ScheduleError("x"), ValueError)


# ------------------------------------------------------------------ RotorNet
@pytest.mark.parametrize("tors", range(4, 17, 2))
def test_rotor_schedule_joins_every_tor_pair_by_exactly_one_rotor_in_every_slot(tors):
    fabric = registry.build(f"rotor,tors={tors}")
    schedule = rotor_schedule(fabric, 100e-6, 10e-6)
    assert schedule.slots == tors - 1 and list(schedule.matchings) == fabric.ocs_switches
    pairs = set(combinations(range(tors), 2))
    for k in range(schedule.slots):
        joined = Counter()
        for ocs, slots in schedule.matchings.items():
            wired = fabric.ports_of(ocs)
            for a, b in slots[k]:
                ta, tb = (fabric.graph.nodes[wired[p][0]]["server"] for p in (a, b))
                joined[(min(ta, tb), max(ta, tb))] += 1
        assert set(joined) == pairs and set(joined.values()) == {1}, f"slot {k}"


def test_rotor_schedule_is_the_rotation_of_the_matchings_from_the_initial_circuits():
    fabric = registry.build("rotor,tors=6")
    schedule = rotor_schedule(fabric, 100e-6, 10e-6, tdf=20.0)
    for r, ocs in enumerate(fabric.ocs_switches):
        assert set(schedule.matchings[ocs][0]) == fabric.circuits[ocs]            # slot 0
        for k in range(5):
            assert set(schedule.matchings[ocs][k]) == rotor.matching_circuits(6, (k + r) % 5)
    assert schedule.tdf == 20.0 and schedule.period_ns == 2_000_000


def test_rotor_schedule_with_fewer_rotors_joins_each_pair_at_most_once_per_slot():
    fabric = registry.build("rotor,tors=8,rotors=3")
    schedule = rotor_schedule(fabric, 100e-6, 10e-6)
    assert schedule.slots == 7 and len(schedule.matchings) == 3
    for k in range(7):
        circuits = Counter(c for slots in schedule.matchings.values() for c in slots[k])
        assert sum(circuits.values()) == 3 * 4                   # 3 rotors x 4 circuits


def test_rotor_schedule_needs_the_rotor_fabric():
    with pytest.raises(ScheduleError, match="^rotor_schedule: a rotor schedule needs the 'rotor' "
                                            "fabric, this is 'hybrid'$"):
        rotor_schedule(hybrid(), 1e-4, 1e-5)
    with pytest.raises(ScheduleError, match=r"^schedule\.guard_s"):
        rotor_schedule(registry.build("rotor"), 1e-4, 1e-4)


# ------------------------------------------------------------------ OCS entries
def test_compile_ocs_period_guard_peers_and_epoch_with_tdf():
    fabric = hybrid()
    indexes = ocs_indexes(fabric)
    o1 = indexes["o1"]                                          # port p -> 1000 + p
    slots = [RING4, ((1, 4),), ((2, 3), (1, 4))]                # slot 1: ports 2, 3 unmatched
    schedule = Schedule(slot_s=200e-6, guard_s=20e-6, matchings={"o1": slots}, tdf=10.0)
    epoch = 5_000_000_000
    plan = ocs_plan(schedule, indexes, epoch)
    assert list(plan) == ["o1"]                                 # the ToRs' ports are left alone
    assert plan["o1"] == {
        o1[1]: Cyclic(epoch, 2_000_000, 200_000, (o1[2], o1[4], o1[4])),
        o1[2]: Cyclic(epoch, 2_000_000, 200_000, (o1[1], 0, o1[3])),
        o1[3]: Cyclic(epoch, 2_000_000, 200_000, (o1[4], 0, o1[2])),
        o1[4]: Cyclic(epoch, 2_000_000, 200_000, (o1[3], o1[1], o1[1])),
    }
    compiled = compile_ocs(schedule, indexes, epoch)
    assert list(compiled) == ["o1"] and sorted(compiled["o1"]) == sorted(o1.values())
    for ifindex, circuit in compiled["o1"].items():
        expected = plan["o1"][ifindex]
        assert circuit == entry.cyclic(epoch, 2_000_000, 200_000, expected.peers)
        assert (circuit.mode, circuit.nslots, circuit.epoch) == (entry.CYCLIC, 3, epoch)
        # What the kernel will do: dark before the epoch and in every guard.
        assert entry.peer_at(circuit, epoch - 1) == 0
        for cycle in range(2):
            for k in range(3):
                start = epoch + (cycle * 3 + k) * 2_000_000
                assert entry.peer_at(circuit, start) == 0
                assert entry.peer_at(circuit, start + 199_999) == 0
                assert entry.peer_at(circuit, start + 200_000) == expected.peers[k]
                assert entry.peer_at(circuit, start + 1_999_999) == expected.peers[k]


def test_compile_ocs_keeps_ports_that_no_slot_uses_dark_and_needs_every_ifindex():
    fabric = hybrid()
    indexes = ocs_indexes(fabric)
    schedule = Schedule(1e-4, 1e-5, {"o1": [((1, 2),)]})
    plan = ocs_plan(schedule, indexes, 0)["o1"]
    assert plan[indexes["o1"][3]].peers == plan[indexes["o1"][4]].peers == (0,)
    del indexes["o1"][2]
    with pytest.raises(ScheduleError, match=r"^ifindexes\['o1'\]: no ifindex for port 2$"):
        compile_ocs(schedule, indexes, 0)
    with pytest.raises(ScheduleError, match=r"^ifindexes: no ports of 'o1'$"):
        compile_ocs(schedule, {}, 0)


# ------------------------------------------------------------------ ToR time-flow tables
def follow(fabric, indexes, tor, uplink_ifindex, schedule, k):
    """The ToR a frame reaches in slot k when ``tor`` sends it up ``uplink_ifindex``:
    ToR uplink -> rotor port -> the circuit's far port -> the ToR wired there."""
    (port,) = [p for p, i in indexes[tor].items() if i == uplink_ifindex]
    ocs, ocs_port = fabric.peer(tor, port)
    far = {a: b for pair in schedule.matchings[ocs][k] for a, b in (pair, pair[::-1])}
    return fabric.peer(ocs, far[ocs_port])[0]


@pytest.mark.parametrize("spec", ["rotor", "rotor,tors=6,hosts_per_tor=2",
                                  "rotor,tors=8,rotors=3,hosts_per_tor=2"])
def test_compile_tor_peers_agree_with_the_ocs_matchings(spec):
    fabric = registry.build(spec)
    indexes = ocs_indexes(fabric)
    schedule = rotor_schedule(fabric, 100e-6, 10e-6, tdf=4.0)
    epoch = 123_456_789
    plan = tor_plan(schedule, fabric, indexes, epoch)
    compiled = compile_tor(schedule, fabric, indexes, epoch)
    assert list(plan) == list(compiled) == fabric.eps_switches
    full = fabric.params["rotors"] == fabric.params["tors"] - 1
    for tor, table in plan.items():
        remote = [h for h in fabric.hosts if fabric.host_port(h)[0] != tor]
        assert list(table) == [fabric.graph.nodes[h]["ip"] for h in remote]
        assert set(compiled[tor]) == {entry.ipv4_key(fabric.graph.nodes[h]["ip"])
                                      for h in remote}
        for host in remote:
            ip = fabric.graph.nodes[host]["ip"]
            cyclic = table[ip]
            assert (cyclic.epoch_ns, cyclic.period_ns, cyclic.guard_ns) == (epoch, 400_000, 0)
            assert compiled[tor][entry.ipv4_key(ip)] == entry.cyclic(epoch, 400_000, 0,
                                                                     cyclic.peers)
            home = fabric.host_port(host)[0]
            for k, uplink in enumerate(cyclic.peers):
                if uplink:
                    assert follow(fabric, indexes, tor, uplink, schedule, k) == home
                else:
                    assert not full, f"{tor} -> {host}: no rotor in slot {k}"
                    assert all(follow(fabric, indexes, tor, indexes[tor][p], schedule, k) != home
                               for p, (peer, _) in fabric.ports_of(tor).items()
                               if fabric.kind(peer) == "ocs")
            if not full:
                assert sum(1 for u in cyclic.peers if u) == 3    # each pair: 3 of 7 slots


def test_compile_tor_on_a_custom_schedule_with_dark_slots():
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=1")     # s1: h1, o1 ports 1, 2
    indexes = ocs_indexes(fabric)
    schedule = Schedule(1e-4, 1e-5, {"o1": [((2, 3),), (), ((1, 4), (2, 3))]})
    plan = tor_plan(schedule, fabric, indexes, 7)
    # s1's uplinks to o1 ports 1 and 2; slot 2 joins s1 and s2 twice: the lower port wins.
    uplink1, uplink2 = (indexes["s1"][fabric.peer("o1", p)[1]] for p in (1, 2))
    assert uplink1 < uplink2
    assert plan["s1"] == {"10.0.0.2": Cyclic(7, 100_000, 0, (uplink2, 0, uplink1))}
    assert plan["s2"] == {"10.0.0.1": Cyclic(7, 100_000, 0, (
        indexes["s2"][fabric.peer("o1", 3)[1]], 0, indexes["s2"][fabric.peer("o1", 3)[1]]))}


# ------------------------------------------------------------------ slot boundaries
def test_slot_boundaries_list_the_slots_of_a_window():
    # epoch 1,000 ns, slots of 100 ns with a 10 ns guard.
    assert slot_boundaries(1000, 100, 10, 1150, 1420) == [
        (1, 1110, 1200), (2, 1210, 1300), (3, 1310, 1400), (4, 1410, 1500)]
    assert slot_boundaries(1000, 100, 10, 1200, 1300) == [(2, 1210, 1300)]
    assert slot_boundaries(1000, 100, 0, 0, 1050) == [(0, 1000, 1100)]        # none before
    assert slot_boundaries(1000, 100, 10, 0, 1000) == []
    assert slot_boundaries(1000, 100, 10, 1500, 1500) == []
    with pytest.raises(ScheduleError, match="period_ns must be > 0"):
        slot_boundaries(0, 0, 0, 0, 10)
    with pytest.raises(ScheduleError, match=r"guard_ns must be >= 0 and < period_ns \(100\)"):
        slot_boundaries(0, 100, 100, 0, 10)


def test_slot_boundaries_agree_with_the_kernel_entry():
    fabric = registry.build("rotor")
    schedule = rotor_schedule(fabric, 50e-6, 5e-6, tdf=3.0)
    epoch = 10_000
    circuit = next(iter(compile_ocs(schedule, ocs_indexes(fabric), epoch)["o1"].values()))
    for n, lit, dark in slot_boundaries(epoch, schedule.period_ns, schedule.guard_ns,
                                        epoch, epoch + 7 * schedule.period_ns):
        assert entry.peer_at(circuit, lit - 1) == 0 and entry.peer_at(circuit, lit) != 0
        assert entry.peer_at(circuit, dark - 1) == entry.peer_at(circuit, lit)
        assert entry.peer_at(circuit, dark) == 0
        assert entry.peer_at(circuit, lit) == circuit.peers[n % schedule.slots]


# ------------------------------------------------------------------ scenario data
def test_from_dict_reads_both_forms():
    fabric = registry.build("rotor")
    rotor_form = from_dict({"rotor": True, "slot_us": 100, "guard_us": 10}, fabric, 8.0,
                           "schedule")
    assert rotor_form == rotor_schedule(fabric, 100e-6, 10e-6, tdf=8.0)
    plain = from_dict({"slot_us": 50.0, "guard_us": 0,
                       "matchings": {"o1": [[[1, 2], [3, 4]], [[1, 3]]],
                                     "o2": [[], [[2, 4]]]}}, fabric, 1.0, "schedule")
    assert plain.matchings == {"o1": (((1, 2), (3, 4)), ((1, 3),)), "o2": ((), ((2, 4),))}
    assert (plain.slot_s, plain.guard_s, plain.slots) == (50e-6, 0.0, 2)


@pytest.mark.parametrize("data, message", [
    ({"rotor": True, "slot_us": 100, "guard_us": 10, "slots": 3},
     r"^sc\.schedule: unknown key 'slots'; allowed: rotor, slot_us, guard_us, matchings$"),
    ({"rotor": True, "guard_us": 10}, r"^sc\.schedule\.slot_us: missing"),
    ({"rotor": True, "slot_us": 100}, r"^sc\.schedule\.guard_us: missing"),
    ({"rotor": True, "slot_us": "100", "guard_us": 10},
     r"^sc\.schedule\.slot_us: must be a finite number, got '100'$"),
    ({"rotor": True, "slot_us": 0, "guard_us": 0}, r"^sc\.schedule\.slot_us: must be > 0"),
    ({"rotor": True, "slot_us": 100, "guard_us": 100},
     r"^sc\.schedule\.guard_us: must be >= 0 and < slot_us \(100\), got 100$"),
    ({"rotor": "yes", "slot_us": 100, "guard_us": 10},
     r"^sc\.schedule\.rotor: must be true or false, got 'yes'$"),
    ({"rotor": True, "slot_us": 100, "guard_us": 10, "matchings": {}},
     r"^sc\.schedule: give rotor = true or matchings, not both$"),
    ({"slot_us": 100, "guard_us": 10},
     r"^sc\.schedule: give rotor = true .* or matchings .*; allowed keys: rotor, slot_us"),
    ({"slot_us": 100, "guard_us": 10, "matchings": [[1, 2]]},
     r"^sc\.schedule\.matchings: must be a non-empty table of OCS name -> list of slots"),
    ({"slot_us": 100, "guard_us": 10, "matchings": {"o1": [[[1, 2, 3]]]}},
     r"^sc\.schedule\.matchings\['o1'\]\[0\]\[0\]: a circuit is a \[port, port\] pair"),
    ({"slot_us": 100, "guard_us": 10, "matchings": {"o1": [[[1, 9]]]}},
     r"^sc\.schedule\.matchings\['o1'\]\[0\]: port 9 is not a port of o1 \(radix 4"),
    ({"slot_us": 100, "guard_us": 10, "matchings": {"o7": [[[1, 2]]]}},
     r"^sc\.schedule\.matchings\['o7'\]: no OCS 'o7' in fabric 'rotor'"),
])
def test_from_dict_errors_name_where_and_the_key(data, message):
    with pytest.raises(ScheduleError, match=message):
        from_dict(data, registry.build("rotor"), 1.0, "sc.schedule")


def test_from_dict_rotor_needs_the_rotor_fabric_and_tdf_at_least_one():
    data = {"rotor": True, "slot_us": 100, "guard_us": 10}
    with pytest.raises(ScheduleError, match=r"^schedule\.rotor: a rotor schedule needs the "
                                            r"'rotor' fabric, this is 'hybrid'$"):
        from_dict(data, hybrid(), 1.0, "schedule")
    with pytest.raises(ScheduleError, match=r"^schedule\.tdf: must be >= 1"):
        from_dict(data, registry.build("rotor"), 0.1, "schedule")
