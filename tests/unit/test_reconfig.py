"""FabricService and the ordered OCS reconfiguration, over fake datapaths.

The reconfiguration (controllers/reconfig.py) runs in four rounds of
messages, each confirmed by barriers before the next one starts: EPS moves
off the torn circuits; the OCS tear together with the EPS repoint of the
destinations that only torn circuits reached; the OCS light; the EPS
restore over the new circuits.
"""

import time
from dataclasses import dataclass
from typing import List

import pytest
from fakes import FakeDatapath, FakeNetwork, RecordingApplier, assert_delivered

from controllers.intents import Lightpath, Reset, Route
from controllers.openflow import applier as applier_module
from controllers.openflow.applier import OpenFlowApplier, SwitchError
from controllers.openflow.compat import ofp, parser
from controllers.control import ControlClient, ControlError, ControlServer
from controllers.reconfig import reconfigure
from controllers.service import FabricService
from topologies import hybrid, registry
from topologies.fabric import EPS, OCS, FabricError

DELAY_MS = 5.0
STAMP_ORDER = ["start", "routes_moved", "tear_sent", "torn", "repointed", "dark_end", "lit",
               "routes_restored"]
# hybrid,tors=4: the ring is 2-3, 4-5, 6-7, 8-1 (ToR t has OCS ports 2t+1, 2t+2).
# Keep 2-3 and 4-5, re-wire the ToR3 circuits: the same ring over other ports.
PARTIAL = [(2, 3), (4, 5), (1, 7), (6, 8)]


@dataclass
class Bed:
    fabric: object
    service: FabricService
    network: FakeNetwork
    applier: OpenFlowApplier

    @property
    def journal(self):
        return self.network.journal


def connected(spec: str, dataplane_sync=None, **service_args) -> Bed:
    """A FabricService over the OpenFlow applier, with a fake datapath for every
    switch, barriers answered at once."""
    fabric = registry.build(spec)
    applier = OpenFlowApplier(fabric, dataplane_sync=dataplane_sync)
    service = FabricService(fabric, applier, **service_args)
    network = FakeNetwork(fabric, on_barrier=applier.barrier_replied)
    network.connect(applier, service)
    status = service.status()
    assert status["ready"], f"every fake switch answered its barrier, yet: {status}"
    network.journal.clear()
    return Bed(fabric, service, network, applier)


@pytest.fixture
def ring3():
    return connected("hybrid,tors=3")


@pytest.fixture
def ring4():
    return connected("hybrid,tors=4,hosts_per_tor=1")


def classify(bed: Bed, name: str, msg) -> str:
    kind = bed.fabric.kind(name)
    if isinstance(msg, parser.OFPBarrierRequest):
        return f"{kind}-barrier"
    if isinstance(msg, parser.OFPGroupMod) and msg.command == ofp.OFPGC_MODIFY:
        return f"{kind}-group-modify"
    if isinstance(msg, parser.OFPFlowMod) and msg.command == ofp.OFPFC_DELETE_STRICT:
        return f"{kind}-delete"
    if isinstance(msg, parser.OFPFlowMod) and msg.command == ofp.OFPFC_ADD:
        return f"{kind}-add"
    return f"{kind}-other"


def positions(labels: List[str], label: str) -> List[int]:
    return [i for i, seen in enumerate(labels) if seen == label]


def remote_pairs(fabric):
    return [(s, d) for s in fabric.hosts for d in fabric.hosts
            if fabric.host_port(s)[0] != fabric.host_port(d)[0]]


def ring_reverse(bed: Bed) -> list:
    return sorted(hybrid.circuit_set(bed.fabric, "ring-reverse"))


def custom(bed: Bed, circuits, delay_ms=DELAY_MS) -> dict:
    return bed.service.do_reconfigure("o1", circuits, delay_ms=delay_ms, technology="custom")


def check_at_every_barrier(bed: Bed, pairs) -> list:
    """Trace pairs whenever any switch gets a barrier; returns [(index, pair, trace)]."""
    snapshots = []

    def on_message(datapath, msg):
        if isinstance(msg, parser.OFPBarrierRequest):
            label = len(bed.journal) - 1          # the barrier's place in the journal
            for src, dst in pairs:
                snapshots.append((label, (src, dst), bed.network.trace(src, dst)))

    for datapath in bed.network.datapaths.values():
        datapath.on_message = on_message
    return snapshots


# ---------------------------------------------------------------- timing
def dark_from(stamps):
    """The tear lands between sending it and its confirmation: the middle counts."""
    return (stamps["tear_sent"] + stamps["torn"]) / 2


def test_reconfigure_timestamps_are_ordered_and_dark_lasts_the_delay(ring3):
    result = custom(ring3, ring_reverse(ring3))
    stamps = result["timestamps"]
    assert list(stamps) == STAMP_ORDER
    values = [stamps[k] for k in STAMP_ORDER]
    assert values == sorted(values), f"timestamps out of order: {stamps}"
    assert result["light_lead_s"] == 0.0, "no lighting latency measured yet, so no lead"
    dark = stamps["dark_end"] - dark_from(stamps)
    assert dark >= DELAY_MS / 1000, f"dark for {dark * 1000:.3f} ms, injected {DELAY_MS} ms"
    assert result["dark_s"] == pytest.approx(
        (stamps["dark_end"] + stamps["lit"]) / 2 - dark_from(stamps))
    assert result["dark_s"] >= DELAY_MS / 1000
    assert result["light_latency_s"] == stamps["lit"] - stamps["dark_end"]
    assert result["plan"]["delay_emulated_ms"] == DELAY_MS
    assert ring3.service.ocs["o1"].history == [result]


def test_lighting_starts_early_by_half_the_measured_round_never_more_than_the_delay(ring3):
    first = custom(ring3, ring_reverse(ring3))
    lead = ring3.service.light_lead_s()
    assert lead == first["light_latency_s"] / 2, "one measurement: half that lighting round"
    second = custom(ring3, sorted(hybrid.circuit_set(ring3.fabric, "ring")))
    assert second["light_lead_s"] == pytest.approx(min(lead, DELAY_MS / 1000))
    stamps = second["timestamps"]
    assert stamps["dark_end"] - dark_from(stamps) >= DELAY_MS / 1000 - second["light_lead_s"]


def test_light_lead_is_half_the_median_of_recent_rounds_that_lit_circuits():
    fabric = registry.build("hybrid")
    svc = FabricService(fabric, RecordingApplier(fabric))
    history = svc.ocs["o1"].history
    assert svc.light_lead_s() == 0.0
    for latency in (0.009, 0.001, 0.005):
        history.append({"light_latency_s": latency, "plan": {"light": [(1, 4)]}})
    history.append({"light_latency_s": 9.0, "plan": {"light": []}})  # lit nothing: ignored
    assert svc.light_lead_s() == pytest.approx(0.0025), "half the median of 1, 5 and 9 ms"


def test_reconfigure_core_with_injected_clock_and_lead():
    """reconfigure() itself: rounds, syncs, and the wait from the middle of the tear round."""
    fabric = registry.build("hybrid,tors=4,hosts_per_tor=1")
    svc = FabricService(fabric, RecordingApplier(fabric), tdf=2.0)
    core = svc.ocs["o1"]
    core.set_technology("custom", 3.0)
    events, ticks = [], iter(range(100))
    plan = core.plan(PARTIAL)
    result = reconfigure(svc.eps, core, plan, lambda batch: events.append(list(batch)),
                         clock=lambda: float(next(ticks)),
                         wait_until=lambda t: events.append(("wait", t)),
                         sync=lambda: events.append("sync"), light_lead_s=0.002)
    stamps = result["timestamps"]
    assert (stamps["tear_sent"], stamps["torn"]) == (2.0, 3.0)
    assert events[1] == ["o1"], f"the tear goes out alone, before the repoint: {events[1]}"
    rounds = [sorted(e) if isinstance(e, list) else e for e in events]
    assert rounds == [["s1", "s3"], ["o1"], "sync", ["s4"], ("wait", pytest.approx(2.504)),
                      ["o1"], "sync", ["s1", "s3"]], \
        "moves; the tear alone, sync; the repoint; wait from 2.5 for 3 ms x tdf 2 less the " \
        "2 ms lead; light, sync; restore"
    capped = reconfigure(svc.eps, core, core.plan(sorted(hybrid.circuit_set(fabric, "ring"))),
                         lambda batch: None, clock=time.time, wait_until=lambda t: None,
                         light_lead_s=99.0)
    assert capped["light_lead_s"] == pytest.approx(0.006), "the lead never exceeds the delay"


def test_each_step_is_heard_where_it_happens_with_its_fields():
    """on_step: "start" before the first move, "dark" once the tear is in and
    before the wait, "lit" once the light is confirmed, "done" after the restore."""
    fabric = registry.build("hybrid,tors=4,hosts_per_tor=1")
    svc = FabricService(fabric, RecordingApplier(fabric), tdf=2.0)
    core = svc.ocs["o1"]
    core.set_technology("custom", 3.0)
    events, ticks = [], iter(range(100))
    result = reconfigure(svc.eps, core, core.plan(PARTIAL),
                         lambda batch: events.append(sorted(batch)),
                         clock=lambda: float(next(ticks)),
                         wait_until=lambda t: events.append("wait"),
                         sync=lambda: events.append("sync"),
                         on_step=lambda step, fields: events.append((step, fields)))
    labels = [e[0] if isinstance(e, tuple) else e for e in events]
    assert labels == ["start", ["s1", "s3"], ["o1"], "sync", ["s4"], "dark", "wait", ["o1"],
                      "sync", "lit", ["s1", "s3"], "done"], labels
    steps = dict(e for e in events if isinstance(e, tuple))
    tear, light = [[1, 8], [6, 7]], [[1, 7], [6, 8]]
    assert steps["start"] == {"t": 0.0, "tear": tear, "light": light, "keep": [[2, 3], [4, 5]],
                              "delay_ms": pytest.approx(6.0)}, "3 ms x tdf 2, emulated"
    assert steps["dark"] == {"t": 2.5, "dark_until": pytest.approx(2.506), "tear": tear,
                             "light": light}, "dark from the middle of the tear round (2 .. 3)"
    assert steps["lit"] == {"t": 6.0, "light": light}
    assert steps["done"] == {"t": 7.0, "dark_s": result["dark_s"], "tear": tear,
                             "light": light}
    assert result["dark_s"] == pytest.approx(3.0), "from 2.5 to the middle of 5 .. 6"
    assert all(isinstance(port, int) for pair in steps["start"]["keep"] for port in pair)


def test_the_dark_time_counts_from_when_the_data_plane_says_it_took_the_tear():
    """An applier that times its changes more tightly than the round (the kernel's
    netlink write) sets where the dark time starts and ends: a thread stalled
    before its write must not start the count before the circuit went dark."""
    fabric = registry.build("hybrid,tors=4,hosts_per_tor=1")
    svc = FabricService(fabric, RecordingApplier(fabric))
    core = svc.ocs["o1"]
    core.set_technology("custom", 3.0)
    ticks = iter(range(100))
    # The OCS rounds' windows: the tear was taken at the very end of its round
    # (stamped 2 .. 3), the light just after the wait ended (stamped 4 .. 5).
    taken = [(2.90, 2.92), (4.10, 4.30)]
    waits = []
    result = reconfigure(svc.eps, core, core.plan(PARTIAL),
                         lambda batch: taken.pop(0) if list(batch) == ["o1"] else None,
                         clock=lambda: float(next(ticks)), wait_until=waits.append)
    stamps = result["timestamps"]
    assert (stamps["tear_sent"], stamps["torn"]) == (2.0, 3.0)
    assert result["dark_from"] == pytest.approx(2.91), "the middle of the taken window"
    assert waits == [pytest.approx(2.91 + 0.003)], "not from 2.5, the middle of the round"
    assert result["dark_s"] == pytest.approx(4.20 - 2.91), "to the middle of the light's window"
    assert taken == []


# ---------------------------------------------------------------- ordering
def test_messages_go_moves_then_tear_and_repoint_then_light_then_restore(ring4):
    custom(ring4, PARTIAL)
    labels = [classify(ring4, name, msg) for name, msg in ring4.journal]
    deletes = positions(labels, "ocs-delete")
    adds = positions(labels, "ocs-add")
    modifies = positions(labels, "eps-group-modify")
    assert len(deletes) == len(adds) == 4, f"two circuits torn and two lit: {labels}"
    assert max(deletes) < min(adds), f"an OCS add came before the last delete: {labels}"
    moves = [i for i in modifies if i < deletes[0]]
    repoints = [i for i in modifies if deletes[-1] < i < adds[0]]
    restores = [i for i in modifies if i > adds[-1]]
    assert moves, f"no EPS route moved off the torn circuits before tearing: {labels}"
    assert repoints, f"no stranded route repointed with the tear: {labels}"
    assert restores, f"no EPS route restored over the new circuits: {labels}"
    assert len(moves) + len(repoints) + len(restores) == len(modifies), \
        f"EPS groups changed in the middle of an OCS step: {labels}"
    eps_barriers = positions(labels, "eps-barrier")
    ocs_barriers = positions(labels, "ocs-barrier")
    assert any(moves[-1] < i < deletes[0] for i in eps_barriers), "moves not confirmed"
    assert any(deletes[-1] < i < repoints[0] for i in ocs_barriers), \
        "the tear must be sent (with its barrier) before the repoint in the same round"
    assert any(repoints[-1] < i < adds[0] for i in eps_barriers), "repoint not confirmed"
    assert any(adds[-1] < i < restores[0] for i in ocs_barriers), "light not confirmed"
    switches = {phase: sorted({ring4.journal[i][0] for i in idx})
                for phase, idx in (("moves", moves), ("repoints", repoints),
                                   ("restores", restores))}
    assert switches == {"moves": ["s1", "s3"], "repoints": ["s4"],
                        "restores": ["s1", "s3"]}, \
        f"s1 and s3 lose their paths via s4, only s4 is stranded: {switches}"


def test_kept_circuits_carry_traffic_at_every_step(ring4):
    # h1, h2, h3 hang off s1, s2, s3, which the kept circuits 2-3 and 4-5 chain.
    kept_pairs = [(s, d) for s in ("h1", "h2", "h3") for d in ("h1", "h2", "h3") if s != d]
    snapshots = check_at_every_barrier(ring4, remote_pairs(ring4.fabric))
    custom(ring4, PARTIAL)
    assert snapshots
    for label, (src, dst), result in snapshots:
        stray = [f for f in result.failures if not f.startswith("dropped at o1")]
        assert not stray, f"journal {label}: {src}->{dst} looped, was misdelivered or " \
                          f"dropped at a packet switch: {stray}"
        if (src, dst) in kept_pairs:
            assert not result.failures, f"journal {label}: {src}->{dst} lost a path although " \
                                        f"kept circuits join them: {result.failures}"


def test_ring_to_ring_reverse_keeps_routes_until_the_ocs_goes_dark(ring3):
    pairs = remote_pairs(ring3.fabric)
    for src, dst in pairs:
        assert_delivered(ring3.network, src, dst)
    snapshots = check_at_every_barrier(ring3, pairs)
    custom(ring3, ring_reverse(ring3))
    labels = [classify(ring3, name, msg) for name, msg in ring3.journal]
    first_delete, first_add = labels.index("ocs-delete"), labels.index("ocs-add")
    assert labels[:first_delete] == [], \
        f"every circuit is torn, so no route may change before the tear: {labels}"
    dark = [(label, pair, result) for label, pair, result in snapshots
            if first_delete < label < first_add]
    assert len(dark) >= 2 * len(pairs), "expected checks after the tear and after the repoint"
    for label, (src, dst), result in dark:
        assert not result.delivered, f"journal {label}: {src}->{dst} crosses a dark OCS"
        for failure in result.failures:
            assert failure.startswith("dropped at o1"), \
                f"journal {label}: while dark, {src}->{dst} must wait at the OCS, not loop " \
                f"or stop at a ToR: {failure}"


def test_after_reconfigure_traffic_uses_only_the_new_circuits(ring3):
    old = set(ring3.fabric.circuits["o1"])
    new = set(hybrid.circuit_set(ring3.fabric, "ring-reverse"))
    assert not old & new
    custom(ring3, sorted(new))
    assert ring3.fabric.circuits["o1"] == new
    used = set()
    for src, dst in remote_pairs(ring3.fabric):
        result = assert_delivered(ring3.network, src, dst)
        used |= ring3.network.ocs_hops(result.delivered)
    assert used == new, f"traffic crosses {sorted(used)}, new circuits are {sorted(new)}"
    partner = {a: b for a, b in new} | {b: a for a, b in new}
    table = ring3.network.tables["o1"]
    for port in range(1, ring3.fabric.graph.nodes["o1"]["radix"] + 1):
        assert table.output_ports(port) == {partner[port]}, \
            f"OCS in_port {port} leaves by {sorted(table.output_ports(port))}, expected " \
            f"{partner[port]} of the new circuits (torn ones: {sorted(old)})"


def test_dataplane_sync_follows_the_tear_and_the_light():
    calls = []
    bed = connected("hybrid,tors=3", dataplane_sync=lambda: calls.append(
        (time.time(), [classify(bed, n, m) for n, m in bed.journal])))
    result = custom(bed, ring_reverse(bed))
    assert len(calls) == 2, f"expected one sync after the tear and one after the light: {calls}"
    (t_tear, seen_tear), (t_light, seen_light) = calls
    assert seen_tear[-1].endswith("-barrier") and "ocs-delete" in seen_tear \
        and "ocs-add" not in seen_tear, f"first sync must follow the confirmed tear: {seen_tear}"
    assert seen_light[-1] == "ocs-barrier" and "ocs-add" in seen_light
    stamps = result["timestamps"]
    assert t_tear <= stamps["torn"], "the dark time is counted from the confirmed tear"
    assert t_light <= stamps["lit"]


def test_reconnected_ocs_gets_the_current_circuits(ring3):
    custom(ring3, ring_reverse(ring3), delay_ms=0.0)
    old = ring3.network.datapaths["o1"]
    ring3.applier.switch_disconnected(old)
    assert "o1" in ring3.service.status()["missing"]
    fresh = FakeDatapath(old.id, "o1", ring3.applier.barrier_replied)
    ring3.network.datapaths["o1"] = fresh
    ring3.applier.switch_connected(fresh, ring3.service.start("o1"))
    ring3.applier.barrier_replied(fresh, fresh.sent[-1].xid)
    assert ring3.service.status()["ready"]
    for src, dst in remote_pairs(ring3.fabric):
        assert_delivered(ring3.network, src, dst)


# ---------------------------------------------------------------- refused requests
def test_unknown_ocs_is_refused_and_nothing_changes(ring3):
    before = ring3.service.state()
    with pytest.raises(FabricError, match=r"unknown OCS 'o9'; OCS in this fabric: \['o1'\]"):
        ring3.service.do_reconfigure("o9", [])
    assert ring3.journal == [], "nothing may be sent for a refused request"
    assert ring3.service.state() == before


@pytest.mark.parametrize("circuits,message", [
    ([(1, 2), (2, 3)], "port 2 is already used"),
    ([(1, 99)], "beyond radix 6"),
    ([(4, 4)], "connects a port to itself"),
])
def test_invalid_circuits_are_refused_and_nothing_changes(ring3, circuits, message):
    before = ring3.service.state()
    table_before = dict(ring3.service.eps.table)
    with pytest.raises(FabricError, match=message):
        custom(ring3, circuits)
    assert ring3.journal == [], f"sent {len(ring3.journal)} messages for a refused request"
    assert ring3.service.state() == before, "a refused request changed the controller state"
    assert ring3.service.eps.table == table_before
    assert ring3.service.ocs["o1"].history == []


def test_refused_requests_come_back_over_the_control_channel(ring3, tmp_path):
    server = ControlServer(str(tmp_path / "ctl" / "c.sock"), ring3.service.handle)
    server.start()
    client = ControlClient(server.path, timeout=5)
    try:
        with pytest.raises(ControlError, match="unknown OCS 'o9'"):
            client.call("reconfigure", ocs="o9", circuits=[])
        with pytest.raises(ControlError, match="beyond radix"):
            client.call("reconfigure", ocs="o1", circuits=[[1, 99]])
        assert ring3.journal == []
        result = client.call("reconfigure", ocs="o1", circuits=ring_reverse(ring3),
                             technology="custom", delay_ms=1.0)
        assert result["plan"]["light"] == [list(c) for c in ring_reverse(ring3)]
        assert client.call("state")["circuits"]["o1"] == [list(c) for c in ring_reverse(ring3)]
        assert client.call("status")["ready"]
    finally:
        client.close()
        server.stop()


def test_presets_through_the_service(ring3):
    reply = ring3.service.do_preset("o1", "piezo")
    assert reply == {"ocs": "o1", "technology": "piezo", "delay_real_ms": 25.0,
                     "delay_emulated_ms": 25.0}
    assert ring3.service.state()["technology"]["o1"] == {"name": "piezo", "delay_ms": None}
    with pytest.raises(FabricError, match="needs a delay_ms"):
        ring3.service.do_preset("o1", "custom")
    assert ring3.service.state()["technology"]["o1"]["name"] == "piezo"
    assert set(ring3.service.handle({"op": "technologies"})["technologies"]) == {
        "rotornet", "mems", "piezo", "lc", "robotic"}
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        ring3.service.handle({"op": "nope"})


# ---------------------------------------------------------------- switch failures
def test_switch_error_during_apply_raises(ring3):
    def reject_flow_mods(datapath, msg):
        if isinstance(msg, parser.OFPFlowMod):
            ring3.applier.error_received(datapath, "OFPErrorMsg type=5 code=0")

    ring3.network.datapaths["o1"].on_message = reject_flow_mods
    with pytest.raises(SwitchError, match=r"switch errors: dpid 1: OFPErrorMsg type=5 code=0"):
        ring3.service.apply({"o1": [Lightpath("o1", 1, 2, lit=True)]})
    with pytest.raises(SwitchError, match="OFPErrorMsg"):
        custom(ring3, ring_reverse(ring3), delay_ms=0.0)
    assert not ring3.service.status()["ready"]


def test_switch_that_never_answers_the_barrier_times_out(ring3, monkeypatch):
    monkeypatch.setattr(applier_module, "BARRIER_TIMEOUT_S", 0.05)
    ring3.network.datapaths["s2"].on_barrier = None
    started = time.monotonic()
    with pytest.raises(SwitchError, match=r"s2 did not answer a barrier within 0\.05 s"):
        ring3.service.apply({"s1": [], "s2": [], "o1": []})
    assert time.monotonic() - started < 1.0, "the timeout must bound the wait"


def test_apply_to_a_disconnected_switch_raises(ring3):
    ring3.applier.switch_disconnected(ring3.network.datapaths["s3"])
    with pytest.raises(SwitchError, match="s3 is not connected"):
        ring3.service.apply({"s3": []})


# ---------------------------------------------------------------- link failures
def test_link_failure_reroutes_around_it_and_recovery_restores_ecmp():
    bed = connected("fattree,k=4")
    fabric, svc = bed.fabric, bed.service
    edge, agg = "s7", "s5"
    assert fabric.graph.nodes[edge]["role"] == "edge" and fabric.graph.nodes[agg]["role"] == "agg"
    port_edge = fabric.graph.edges[edge, agg, 0]["ports"][edge]
    port_agg = fabric.graph.edges[edge, agg, 0]["ports"][agg]
    far = fabric.hosts[-1]
    assert len(assert_delivered(bed.network, "h1", far).delivered) == 4

    reply = svc.do_link(edge, agg, up=False)
    assert edge in reply["changed_switches"] and agg in reply["changed_switches"]
    assert svc.state()["down_links"] == [sorted((edge, agg))]
    for src in fabric.hosts:
        for dst in fabric.hosts:
            if src == dst:
                continue
            result = assert_delivered(bed.network, src, dst)
            for path in result.delivered:
                for hop in path:
                    assert (hop.node, hop.out_port) not in {(edge, port_edge), (agg, port_agg)}, \
                        f"{src}->{dst} crosses the failed link {edge}-{agg}: {path}"
    assert len(assert_delivered(bed.network, "h1", far).delivered) == 2, \
        "with one uplink gone, h1 keeps the two core paths of the other aggregation switch"

    svc.do_link(agg, edge, up=True)
    assert svc.state()["down_links"] == []
    assert len(assert_delivered(bed.network, "h1", far).delivered) == 4


def test_link_that_does_not_exist_is_refused(ring3):
    with pytest.raises(FabricError, match="no link s1-s3"):
        ring3.service.do_link("s1", "s3", up=False)
    assert ring3.journal == []


def test_status_lists_missing_switches_until_all_answered():
    fabric = registry.build("hybrid")
    applier = OpenFlowApplier(fabric)
    svc = FabricService(fabric, applier)
    assert svc.status()["missing"] == sorted(fabric.switches)
    network = FakeNetwork(fabric)           # no automatic barrier replies
    for name, datapath in network.datapaths.items():
        applier.switch_connected(datapath, svc.start(name))
    assert not svc.status()["ready"]
    for datapath in network.datapaths.values():
        applier.barrier_replied(datapath, datapath.sent[-1].xid)
    assert svc.status()["ready"] and svc.status()["missing"] == []
    assert {fabric.kind(n) for n in svc.status()["ready_switches"]} == {EPS, OCS}


def test_port_status_down_reroutes_once_and_up_restores():
    bed = connected("fattree,k=4")
    fabric, svc = bed.fabric, bed.service
    edge, agg = "s7", "s5"
    port_edge = fabric.graph.edges[edge, agg, 0]["ports"][edge]
    port_agg = fabric.graph.edges[edge, agg, 0]["ports"][agg]
    far = fabric.hosts[-1]

    reply = svc.port_changed(edge, port_edge, up=False)
    assert reply is not None and edge in reply["changed_switches"]
    assert svc.port_changed(agg, port_agg, up=False) is None, \
        "the far end's report of the same link must not reroute again"
    assert svc.state()["down_links"] == [sorted((edge, agg))]
    assert len(assert_delivered(bed.network, "h1", far).delivered) == 2

    assert svc.port_changed(agg, port_agg, up=True) is None, \
        "one end back up while the other still reports down: the link stays down"
    assert svc.state()["down_links"] == [sorted((edge, agg))]
    assert svc.port_changed(edge, port_edge, up=True) is not None
    assert svc.state()["down_links"] == []
    assert len(assert_delivered(bed.network, "h1", far).delivered) == 4



def test_a_link_shows_down_in_the_state_only_once_its_routes_are_written():
    fabric = registry.build("fattree,k=4")
    seen_during_apply = []

    class Watching(RecordingApplier):
        def apply(self, batch):
            seen_during_apply.append(service.state()["down_links"])
            super().apply(batch)

    service = FabricService(fabric, Watching(fabric))
    service.do_link("s7", "s5", up=False)
    assert seen_during_apply == [[]], "a waiter must not see the link down before its routes"
    assert service.state()["down_links"] == [["s5", "s7"]]
    service.do_link("s7", "s5", up=True)
    assert seen_during_apply[-1] == [["s5", "s7"]] and service.state()["down_links"] == []

def test_port_status_of_an_unwired_port_is_ignored():
    bed = connected("fattree,k=4")
    local_port = 0xfffffffe
    assert bed.service.port_changed("s7", local_port, up=False) is None
    assert bed.service.state()["down_links"] == []


def test_a_link_failed_by_hand_stays_down_when_its_ports_report_up():
    bed = connected("fattree,k=4")
    svc = bed.service
    edge, agg = "s7", "s5"
    port_edge = bed.fabric.graph.edges[edge, agg, 0]["ports"][edge]
    svc.do_link(edge, agg, up=False)
    assert svc.port_changed(edge, port_edge, up=True) is None
    assert svc.state()["down_links"] == [sorted((edge, agg))]
    # Ports down, then the manual failure lifted: still down until the ports come up.
    svc.port_changed(edge, port_edge, up=False)
    svc.do_link(edge, agg, up=True)
    assert svc.state()["down_links"] == [sorted((edge, agg))]
    svc.port_changed(edge, port_edge, up=True)
    assert svc.state()["down_links"] == []


# ---------------------------------------------------------------- intents, whatever the data plane
def test_a_reconfiguration_hands_its_applier_five_rounds_of_intents():
    """Data-plane neutral: the same sequence any applier would be given."""
    fabric = registry.build("hybrid,tors=4,hosts_per_tor=1")
    applier = RecordingApplier(fabric)
    svc = FabricService(fabric, applier)
    svc.do_reconfigure("o1", PARTIAL, technology="custom", delay_ms=0.0)
    moved, torn, repointed, lit, restored = applier.batches
    assert all(isinstance(i, Route) for intents in moved.values() for i in intents)
    assert torn == {"o1": [Lightpath("o1", 1, 8, False), Lightpath("o1", 6, 7, False)]}, \
        "the tear, alone, names the circuits that go, dark"
    assert list(repointed) == ["s4"] and all(isinstance(i, Route) for i in repointed["s4"]), \
        "then the stranded destinations point at the circuits about to light"
    assert lit == {"o1": [Lightpath("o1", 1, 7, True), Lightpath("o1", 6, 8, True)]}
    assert all(isinstance(i, Route) for intents in restored.values() for i in intents)
    assert applier.syncs == 2, "the data plane is confirmed after the tear and after the light"


def test_link_and_pin_ops_hand_their_applier_routes_and_pin_hops():
    fabric = registry.build("fattree,k=4")
    applier = RecordingApplier(fabric)
    svc = FabricService(fabric, applier)
    svc.do_link("s7", "s5", up=False)
    (batch,) = applier.batches
    assert {"s7", "s5"} <= set(batch)
    assert all(isinstance(i, Route) for intents in batch.values() for i in intents)
    s7_routes = {r.dst: r.ports for r in batch["s7"]}
    port = fabric.graph.edges["s7", "s5", 0]["ports"]["s7"]
    assert all(port not in ports for ports in s7_routes.values()), \
        "no route of s7 leaves by the failed link"
    assert svc.start("s1") == [Reset("s1")] + svc.eps.switch_start("s1"), \
        "a switch that connects is reset, then given its routes"
