"""The P/D request stream on the flow-level model: the replayer's gates, order and failover."""

from __future__ import annotations

from collections import defaultdict

import pytest

from emu.experiments import pd_failure, pd_setup
from topologies import registry
from traffic import failover
from traffic import requests as rq
from traffic.kvflows import kv_transfer
from traffic.model.network import key_of
from traffic.model.pd import (ReplayConstants, ModelSettings, NodeFailure, emulated_network,
                              serve_model)
from traffic.pdplan import Planned, plan, request_of
from traffic.pdstats import peak_concurrency
from traffic.results import FlowResult
from traffic.scale import Scale

ZCUBE = "zcube,n=4,gpus_per_server=2"
SCALE = Scale.from_rates(200, 10, tdf=10)
SETTINGS = dict(workload="deep-thinking", requests=16, rate_per_s=30.0, seed=1, tp=2,
                placement="tiles", tile="3p2d")
#: pd-failure's defaults: arrivals above what the KV links carry.
FAILURE_SETTINGS = dict(SETTINGS, requests=24, rate_per_s=100.0)


def _plan(spec=ZCUBE, settings=SETTINGS, ms=5.0, **options):
    """Fabric, topology and plan, as pd-inference makes them (`pd_setup`)."""
    fabric = registry.build(spec)
    topo = pd_setup.topology(fabric, settings["tp"])
    place = pd_setup.make_placement(topo, settings)
    planned = plan(topo, place, pd_setup.stream_of(settings), SCALE, "fixed", ms,
                   settings["seed"], **options)
    return fabric, topo, planned


def _serve(fabric, planned, credits=2, **options):
    net = emulated_network(fabric, SCALE)
    settings = ModelSettings(SCALE, path_credits=options.pop("path_credits", None),
                             lane_capacity=options.pop("lane_capacity", 1))
    return net, serve_model(planned, net, settings, credits, **options)


def _request_spans(served):
    """Request id -> (first start, last end) of its flows that ended ok."""
    spans = {}
    for f in served.results:
        if f.status == "ok":
            rid = request_of(f.id)
            start, end = spans.get(rid, (f.start, f.end))
            spans[rid] = (min(start, f.start), max(end, f.end))
    return spans


# ---------------------------------------------------------------- records and stats
def test_every_request_is_served_with_records_pdstats_reads():
    fabric, _, planned = _plan()
    _, served = _serve(fabric, planned)
    assert served.t0 == 0.0
    assert [f.id for f in served.results] == [fid for x in planned for fid in x.flow_ids]
    for f in served.results:
        assert isinstance(f, FlowResult)          # the replayer's own record
        assert f.status == "ok" and f.bytes_received == f.bytes and f.end > f.start
        assert f.to_dict()["duration_s"] == pytest.approx(f.end - f.start)
    assert served.summary["served_count"] == len(planned)
    assert served.summary["requests_count"] == len(planned)
    assert all(row["served"] for row in served.rows)
    assert served.summary["throughput_emu_rps"] > 0
    assert served.ingress and served.streams


def test_zcube_flows_are_routed_on_their_planned_dual_path():
    """The model routes a KV flow like the testbed (ECMP from its NIC ports);
    on ZCube the ports fix the path, so it is the planned one."""
    fabric, _, planned = _plan()
    net = emulated_network(fabric, SCALE)
    for x in planned:
        for flow, path in zip(x.transfer.dag.flows, x.transfer.paths):
            _, links = net.paths([flow.src], [flow.dst], [key_of(flow.id)])
            assert list(links) == list(net.node_path(path))


# ---------------------------------------------------------------- credits and order
@pytest.mark.parametrize("credits", [1, 2])
def test_credits_never_exceeded(credits):
    fabric, _, planned = _plan()
    _, served = _serve(fabric, planned, credits)
    gate = served.credit_gate
    gate.credits.check()
    assert max(gate.credits.peak_d.values()) <= credits
    spans = _request_spans(served)
    d_of = {x.id: x.d for x in planned}
    per_d = defaultdict(list)
    for rid, span in spans.items():
        per_d[d_of[rid]].append(span)
    assert max(peak_concurrency(s) for s in per_d.values()) <= credits
    assert served.summary["peak_streams_per_d_count"] <= credits
    assert served.summary["served_count"] == len(planned)


def test_credits_bind_less_without_a_limit():
    fabric, _, planned = _plan()
    _, one = _serve(fabric, planned, 1)
    _, unlimited = _serve(fabric, planned, None)
    assert one.summary["credit_wait_mean_s"] > unlimited.summary["credit_wait_mean_s"] == 0.0
    assert one.summary["ttft_p99_s"] >= unlimited.summary["ttft_p99_s"]


def test_each_d_grants_credit_in_due_order():
    """Credit is granted per D in the order requests came due (their prefill
    end, plan order among ties), as the replay loop asks the gate."""
    fabric, _, planned = _plan()
    _, served = _serve(fabric, planned, 1)
    due = {x.id: (x.prefill_end_s, i) for i, x in enumerate(planned)}
    granted = defaultdict(list)
    for _, kind, rid, d in served.credit_gate.credits.events:
        if kind == "grant":
            granted[d].append(rid)
    assert granted
    for d, rids in granted.items():
        assert rids == sorted(rids, key=due.__getitem__)
    spans = _request_spans(served)
    for rids in granted.values():       # and the KV of one D goes in that order
        starts = [spans[rid][0] for rid in rids]
        assert starts == sorted(starts)


def test_ttft_is_prefill_plus_queueing_plus_kv_time():
    fabric, _, planned = _plan()
    _, served = _serve(fabric, planned, 1)
    waited = 0
    for row, x in zip(served.rows, planned):
        assert row["kv_start_s"] >= x.prefill_end_s - 1e-9       # never before it is due
        parts = row["p_queue_s"] + row["prefill_s"] + row["credit_wait_s"] + row["kv_s"]
        assert row["ttft_s"] == pytest.approx(parts, abs=1e-9)
        waited += row["credit_wait_s"] > 0
    assert waited, "one credit per D must make some request wait"


def test_go_delay_is_added_to_every_transfer_start():
    fabric, _, planned = _plan()
    _, served = _serve(fabric, planned, None, calibration=ReplayConstants(go_s=0.01))
    for row, x in zip(served.rows, planned):
        assert row["kv_start_s"] == pytest.approx(x.prefill_end_s + 0.01)


def _incast(n, topo, place):
    """n requests from the P nodes to one D, all due at 0 (prefill done)."""
    d = place.decode[0]
    planned = []
    for i in range(n):
        p = place.prefill[i % len(place.prefill)]
        request = rq.Request(f"q{i}", f"s{i}", 0, 0.0, 4000, 0, 100)
        transfer = kv_transfer(topo, request, p, d, at_s=0.0,
                               bytes_scale=SCALE.bw_factor * SCALE.tdf)
        planned.append(Planned(request, p, d, True, 0.0, 0.0, 0.0, transfer))
    return planned


def test_incast_into_one_d_with_one_credit_takes_n_times_s_over_b():
    fabric = registry.build(ZCUBE)
    topo = pd_setup.topology(fabric, 2)
    place = pd_setup.make_placement(topo, SETTINGS)
    n = 5
    planned = _incast(n, topo, place)
    net, served = _serve(fabric, planned, 1)
    rank = planned[0].transfer.dag.flows[0]
    bps = net.capacity_bps[net.node_path(planned[0].transfer.paths[0])].min()
    one = rank.bytes * 8 / bps                      # S / B: the ranks run side by side
    spans = _request_spans(served)
    ends = sorted(end for _, end in spans.values())
    assert ends == pytest.approx([one * (k + 1) for k in range(n)], rel=1e-6)
    assert [spans[x.id][1] for x in planned] == sorted(spans[x.id][1] for x in planned)
    # Without credits every request starts at once and they share D's ports.
    _, shared = _serve(fabric, planned, None)
    spans = _request_spans(shared)
    assert all(start == 0.0 for start, _ in spans.values())
    assert max(end for _, end in spans.values()) > one * (1 + 1e-6)


def test_path_credits_limit_streams_per_fabric_link():
    fabric, _, planned = _plan()
    _, served = _serve(fabric, planned, 4, path_credits=1)
    credits = served.credit_gate.credits
    credits.check()
    assert max(credits.peak_link.values()) == 1
    assert served.summary["path_credit_peak_per_link_count"] == 1
    assert served.summary["served_count"] == len(planned)


def test_rail_fabric_lane_flows_reserve_their_lane_and_take_it():
    spec = pd_setup.fabric_specs(ZCUBE, ["rail-fabric"])["rail-fabric"]
    fabric, _, planned = _plan(spec, lane_threshold_bytes=0.0)
    _, served = _serve(fabric, planned, 2)
    lanes = served.lane_gate
    lanes.table.check()
    assert served.summary["lane_flows_count"] > 0
    assert served.summary["lane_peak_count"] <= served.summary["lane_capacity_count"] == 1
    assert not lanes.pinned and not any(lanes.table.holders.values())     # all unpinned
    assert served.summary["served_count"] == len(planned)
    # One lane direction carries one flow at a time.
    by_key = defaultdict(list)
    results = {f.id: f for f in served.results}
    for fid, route in lanes.routes.items():
        if lanes.went.get(fid) == "lane":
            by_key[lanes.table.key(route)].append((results[fid].start, results[fid].end))
    assert by_key and max(peak_concurrency(spans) for spans in by_key.values()) == 1


# ---------------------------------------------------------------- failure
def _running_at_middle(served, fabric):
    """A flow running half-way through the healthy run, and its source's ToR."""
    ok = [f for f in served.results if f.status == "ok"]
    flow = sorted(ok, key=lambda f: f.start)[len(ok) // 2]
    return flow, failover.host_switch(fabric, flow.src), (flow.start + flow.end) / 2


def _failing_tor():
    """pd-inference's plan on ZCube, a flow running half-way through it, its
    source's ToR, when the ToR fails (then) and where its NIC ports go."""
    fabric, _, planned = _plan()
    _, healthy = _serve(fabric, planned)
    flow, switch, at_s = _running_at_middle(healthy, fabric)
    return fabric, planned, flow, switch, at_s, failover.failover_map(fabric, [switch])


def test_failure_moves_flows_to_the_failover_port_and_they_finish():
    fabric, planned, flow, switch, at_s, moves = _failing_tor()
    failure = NodeFailure(switch, at_s, moves, notice_s=0.03)
    net, served = _serve(fabric, planned, failure=failure)
    assert failure.noticed_s == 0.03
    assert failure.moved_after_s == pytest.approx(0.03)   # moved as soon as noticed
    assert flow.id in failure.moved                       # it was running: resent in full
    assert not failure.stranded
    assert not net.down_nodes                             # restored for the next run
    results = {f.id: f for f in served.results}
    moved = [f for f in served.results if f.status == "moved"]
    assert moved
    ends = failover.FlowEnds(fabric, moves)
    for old in moved:
        new = results[f"{old.id}~m1"]
        assert new.status == "ok" and new.bytes == old.bytes == new.bytes_received
        assert (new.src, new.dst) == ends(old.src, old.dst)
        assert old.src in moves or old.dst in moves
        assert new.start >= at_s + 0.03 - 1e-9
    resent = results[f"{flow.id}~m1"]
    assert resent.start == pytest.approx(at_s + 0.03)     # due at once when moved
    assert results[flow.id].bytes_received < flow.bytes
    behind = set(moves)
    for f in served.results:                              # nothing starts behind the ToR
        if f.status == "ok" and f.start >= at_s:
            assert f.src not in behind and f.dst not in behind
    assert served.summary["served_count"] == len(planned)
    rows = {r["id"]: r for r in served.rows}
    assert rows[request_of(flow.id)]["moved_flows_count"] >= 1


def test_failure_waits_for_the_control_plane_notice():
    fabric, planned, flow, switch, at_s, moves = _failing_tor()
    ends = {}
    for notice in (0.0, 0.2):
        failure = NodeFailure(switch, at_s, moves, notice_s=notice)
        _, served = _serve(fabric, planned, failure=failure)
        ends[notice] = {f.id: f for f in served.results}[f"{flow.id}~m1"].end
    assert ends[0.2] == pytest.approx(ends[0.0] + 0.2)


def test_a_resend_goes_once_its_processes_run_and_only_a_resend_waits():
    # The replayer starts a cancelled flow's processes anew (`resend_s`):
    # its resend starts that much later; a flow rehosted before it started
    # keeps its due time, and nothing else moves.
    fabric, planned, flow, switch, at_s, moves = _failing_tor()
    runs = {}
    for resend in (0.0, 0.05):
        failure = NodeFailure(switch, at_s, moves, notice_s=0.03)
        _, served = _serve(fabric, planned, failure=failure,
                           calibration=ReplayConstants(resend_s=resend))
        runs[resend] = ({f.id: f for f in served.results}, failure)
    (quick, failure), (slow, _) = runs[0.0], runs[0.05]
    assert slow[f"{flow.id}~m1"].start == pytest.approx(at_s + 0.03 + 0.05)
    assert quick[f"{flow.id}~m1"].start == pytest.approx(at_s + 0.03)
    assert slow[f"{flow.id}~m1"].end > quick[f"{flow.id}~m1"].end
    for fid in failure.rehosted:
        new = f"{fid}~m1" if f"{fid}~m1" in quick else fid
        assert slow[new].start >= quick[new].start - 1e-9
    before = [fid for fid, f in quick.items() if f.end <= at_s]
    assert before and all(slow[fid].end == quick[fid].end for fid in before)


@pytest.mark.parametrize("name", ["roft", "zcube"])
def test_throughput_after_a_failure_is_lower_than_without(name):
    spec = pd_setup.fabric_specs(ZCUBE, [name])[name]
    fabric, _, planned = _plan(spec, FAILURE_SETTINGS, ms=1.0)
    index = len(planned) // 2
    failure = NodeFailure.tor(fabric, planned, index)
    assert failure.at_s == planned[index].arrival_s
    _, healthy = _serve(fabric, planned)
    _, failed = _serve(fabric, planned, failure=failure)
    assert failure.moved or failure.rehosted
    after = {label: pd_failure.window_figures(pd_failure.window(run.rows, True, failure.at_s),
                                              failure.at_s)
             for label, run in (("healthy", healthy), ("failure", failed))}
    assert after["failure"]["served_count"] == after["healthy"]["served_count"]
    assert after["failure"]["throughput_emu_rps"] < after["healthy"]["throughput_emu_rps"]
    before = [pd_failure.window_figures(pd_failure.window(run.rows, False, failure.at_s))
              for run in (healthy, failed)]
    assert before[0]["ttft_p50_s"] <= before[1]["ttft_p50_s"] + 1e-9


#: Four HPN segments: a rail's ToR in a plane serves a quarter of the GPUs on
#: it, so a KV flow may have one end behind a failed ToR and the other not.
HPN_SEGMENTS = "hpn,gpus=64,gpus_per_server=2,radix=8"


def test_hpn_flow_with_one_end_behind_a_failed_tor_is_served_in_the_other_plane():
    """HPN's planes never meet: a KV flow whose P (or D) port fails over to the
    GPU's port in the other plane goes to the other end's port in that plane
    too, as the bonded NIC receives it, instead of waiting on the blackhole
    between the planes until it times out."""
    fabric, _, planned = _plan(HPN_SEGMENTS, FAILURE_SETTINGS, ms=1.0)
    failure = NodeFailure.tor(fabric, planned, len(planned) // 2)
    moves = failure.moves
    one_end = [f for x in planned for f in x.transfer.dag.flows
               if f.at_s > failure.at_s and (f.src in moves) != (f.dst in moves)]
    assert one_end, "a flow due after the failure with one end behind the ToR"
    _, served = _serve(fabric, planned, failure=failure)
    assert not failure.stranded
    results = {f.id: f for f in served.results}
    plane = {h: fabric.graph.nodes[h]["nic_port"] for h in fabric.hosts}
    for flow in one_end:
        carried = results.get(f"{flow.id}~m1", results[flow.id])
        assert carried.status == "ok", (flow, carried)
        assert carried.src not in moves and carried.dst not in moves
        assert plane[carried.src] == plane[carried.dst] != plane[flow.src]
    assert served.summary["served_count"] == len(planned)


def test_a_gpu_cut_off_times_out_and_frees_its_credit():
    fabric, planned, flow, switch, at_s, moves = _failing_tor()
    moves = dict(moves, **{flow.src: None})
    failure = NodeFailure(switch, at_s, moves, notice_s=0.01)
    _, served = _serve(fabric, planned, failure=failure,
                       calibration=ReplayConstants(timeout_s=1.0))
    assert flow.id in failure.stranded
    results = {f.id: f for f in served.results}
    assert results[flow.id].status == "timeout"
    assert results[flow.id].end == pytest.approx(results[flow.id].start + 1.0)
    cut = {request_of(fid) for fid in failure.stranded}
    for fid in failure.stranded:
        assert results[fid].status == "timeout"      # each started, timed out, freed its credit
    rows = {r["id"]: r for r in served.rows}
    assert not any(rows[rid]["served"] for rid in cut)
    assert served.summary["served_count"] == len(planned) - len(cut)
