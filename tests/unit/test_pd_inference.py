"""pd-inference's pure helpers: request -> flows, P queue, credits gate, TTFT math."""

from __future__ import annotations

import pytest

from emu.experiments import pd_inference as pd
from traffic.scale import Scale
from topologies import registry
from traffic import kvcache
from emu.live.replay import FlowResult
from traffic.requests import Request

SETTINGS = dict(workload="deep-thinking", requests=12, rate_per_s=10.0, seed=1,
                placement="tiles", tile="3p2d")
SCALE = Scale.from_rates(200, 10, tdf=10)


def _plan(spec="zcube,n=4,gpus_per_server=2", pairing="fixed", ms=10.0):
    topo = pd.topology(registry.build(spec), 2)
    place = pd.make_placement(topo, SETTINGS)
    return topo, place, pd.plan(topo, place, pd.stream_of(SETTINGS), SCALE, pairing, ms, 1)


def test_request_maps_to_one_flow_per_rank_rank_to_rank():
    topo, place, planned = _plan()
    assert len(planned) == 12
    for x in planned:
        assert x.p in place.prefill and x.d in place.decode
        flows = x.transfer.dag.flows
        assert [f.id for f in flows] == [f"{x.id}-r0", f"{x.id}-r1"]
        assert all(pd.request_of(f.id) == x.id for f in flows)
        src, dst = topo.node(x.p), topo.node(x.d)
        for rank, flow in enumerate(flows):       # rank i of P -> rank i of D
            assert flow.src in src.hosts[rank] and flow.dst in dst.hosts[rank]
            assert flow.at_s == pytest.approx(x.prefill_end_s)
        real = x.request.transfer_bytes(kvcache.GLM_5_1, x.on_home)
        assert x.kv_bytes == pytest.approx(real * SCALE.bw_factor * SCALE.tdf, rel=1e-3)


def test_prefill_queues_fifo_per_p_and_is_dilated():
    _, _, planned = _plan()
    last_end = {}
    for x in planned:
        assert x.prefill_start_s >= x.arrival_s
        assert x.prefill_start_s >= last_end.get(x.p, 0.0) - 1e-9
        real = pd.prefill_seconds(x.request, 10.0)
        assert x.prefill_end_s - x.prefill_start_s == pytest.approx(real * SCALE.tdf)
        last_end[x.p] = x.prefill_end_s


@pytest.mark.parametrize("pairing", ["fixed", "random", "score", "sticky"])
def test_every_pairing_plans_on_zcube_and_roft(pairing):
    for spec in ("zcube,n=4,gpus_per_server=2", "roft,gpus=16,radix=8,gpus_per_server=2"):
        _, _, planned = _plan(spec, pairing)
        assert len(planned) == 12


def test_request_of():
    assert pd.request_of("r000012-r1") == "r000012"
    assert pd.request_of("r0-r10") == "r0"


def test_percentile_linear_and_ordered():
    assert pd.percentile([], 50) is None
    assert pd.percentile([3.0], 99) == 3.0
    assert pd.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert pd.percentile(range(101), 95) == pytest.approx(95)
    values = [0.3, 5.0, 1.2, 0.9, 2.2, 7.5, 0.1]
    p50, p95, p99 = (pd.percentile(values, q) for q in (50, 95, 99))
    assert p50 <= p95 <= p99 <= max(values)
    with pytest.raises(ValueError):
        pd.percentile(values, 101)


def test_peak_concurrency_from_intervals():
    assert pd.peak_concurrency([]) == 0
    assert pd.peak_concurrency([(0, 1), (1, 2), (2, 3)]) == 1      # touching: no overlap
    assert pd.peak_concurrency([(0, 3), (1, 2), (1.5, 4), (3.5, 5)]) == 3
    assert pd.peak_concurrency([(0, 1), (0, 1)]) == 2


def _result(fid, start, end, status="ok"):
    r = FlowResult(fid, "a", "b", 100, None, "kv", start=start, end=end)
    r.status = status
    return r


def test_ttft_rows_and_summary():
    _, _, planned = _plan()
    planned = planned[:3]
    t0 = 1000.0
    flows = []
    for i, x in enumerate(planned):
        begin = x.prefill_end_s + 0.5 * i           # credit wait grows
        flows += [_result(f"{x.id}-r0", t0 + begin, t0 + begin + 1.0),
                  _result(f"{x.id}-r1", t0 + begin + 0.1, t0 + begin + 1.5)]
    rows = pd.request_rows(planned, flows, t0)
    for i, (x, row) in enumerate(zip(planned, rows)):
        assert row["served"]
        assert row["kv_s"] == pytest.approx(1.5)
        assert row["credit_wait_s"] == pytest.approx(0.5 * i)
        assert row["ttft_s"] == pytest.approx(x.prefill_end_s + 0.5 * i + 1.5 - x.arrival_s)
        assert row["ttft_s"] == pytest.approx(row["p_queue_s"] + row["prefill_s"]
                                              + row["credit_wait_s"] + row["kv_s"])
    summary, streams = pd.summarize_fabric(rows, SCALE, 2)
    assert summary["served_count"] == 3
    assert summary["ttft_p50_s"] <= summary["ttft_p95_s"] <= summary["ttft_p99_s"]
    assert summary["ttft_p99_real_ms"] == pytest.approx(summary["ttft_p99_s"] / 10 * 1000)
    assert summary["throughput_emu_rps"] > 0
    assert all(s["credit_limit_count"] == 2 for s in streams)


def test_failed_flow_means_not_served():
    _, _, planned = _plan()
    x = planned[0]
    rows = pd.request_rows([x], [_result(f"{x.id}-r0", 1, 2), _result(f"{x.id}-r1", 1, 2,
                                                                         "failed")], 0.0)
    assert not rows[0]["served"]


class _Flow:
    def __init__(self, fid):
        self.id = fid


def test_credit_gate_admits_whole_requests_within_the_limit():
    _, _, planned = _plan()
    same_d = [x for x in planned if x.d == planned[0].d][:4]
    clock = iter(range(1000)).__next__
    gate = pd.CreditGate(same_d, 2, clock=lambda: float(clock()))
    a, b, c, d = same_d
    assert gate.gate(_Flow(f"{a.id}-r0")) and gate.gate(_Flow(f"{a.id}-r1"))
    assert gate.gate(_Flow(f"{b.id}-r1"))
    assert not gate.gate(_Flow(f"{c.id}-r0"))                  # D full: 2 streams
    assert not gate.gate(_Flow(f"{c.id}-r1"))
    gate.done(_result(f"{a.id}-r0", 0, 1))
    assert not gate.gate(_Flow(f"{c.id}-r0"))                  # a still holds its credit
    gate.done(_result(f"{a.id}-r1", 0, 1))
    assert gate.gate(_Flow(f"{c.id}-r0")) and gate.gate(_Flow(f"{c.id}-r1"))
    assert not gate.gate(_Flow(f"{d.id}-r0"))
    assert gate.credits.peak_d[a.d] == 2


def test_check_names_the_key_for_a_fabric_that_does_not_fit():
    with pytest.raises(ValueError, match="pd-inference.fabrics: unknown fabric 'fattree'; "
                                         "allowed: zcube, roft, railfly, hpn, rail-fabric"):
        pd.fabric_specs("zcube,n=4,gpus_per_server=2", ["fattree"])
    specs = pd.fabric_specs("zcube,n=4,gpus_per_server=2", list(pd.FABRICS))
    gpus = {pd.gpu_count(registry.build(spec)) for spec in specs.values()}
    assert gpus == {16}


def test_cost_rows_note_missing_models():
    rows, notes = pd.cost_rows(["zcube", "roft", "railfly"], 16384, 64)
    assert {r["fabric"] for r in rows} == {"zcube", "roft"}
    assert all(r["cost_total_usd"] > 0 for r in rows)
    assert any("railfly" in n for n in notes)


def test_request_without_flows_is_not_served():
    req = Request("r9", "s9", 0, 0.0, 1000, 0, 10)
    topo, place, _ = _plan()
    x = pd.plan(topo, place, [req], SCALE)[0]
    assert pd.request_rows([x], [], 0.0)[0]["served"] is False


def test_rail_fabric_plans_large_requests_onto_fast_lanes_and_small_ones_on_the_expander():
    topo = pd.topology(registry.build(pd.fabric_specs("zcube,n=4,gpus_per_server=2",
                                                      ["rail-fabric"])["rail-fabric"]), 2)
    place = pd.make_placement(topo, SETTINGS)
    stream = pd.stream_of(SETTINGS)
    planned = pd.plan(topo, place, stream, SCALE, "fixed", 10.0, 1)
    assert all(x.lanes is not None for x in planned)
    large = [x for x in planned if x.lanes.large]
    assert large and len(large) < len(planned) or large, "deep-thinking has large requests"
    for x in large:
        kinds = {route.kind for route in x.lanes.routes}
        assert kinds <= {"lane", "local"}, kinds
        for flow, route in zip(x.transfer.dag.flows, x.lanes.routes):
            assert (flow.src, flow.dst) == (route.path[0], route.path[-1])
    everything_small = pd.plan(topo, place, stream, SCALE, "fixed", 10.0, 1,
                               lane_threshold_bytes=float("inf"))
    assert all(not x.lanes.large and {r.kind for r in x.lanes.routes} <= {"expander", "local"}
               for x in everything_small)


def test_path_credits_hold_a_request_whose_fabric_link_is_full():
    _, _, planned = _plan()
    links = {x.id: pd.fabric_links(x.transfer) for x in planned}
    for x in planned:
        for path in x.transfer.paths:
            assert all(not link.startswith("h") for link in links[x.id])
            assert len(path) >= 3
    # Two requests sharing a switch-to-switch link; D credits (4) never bind here.
    pair = next(((a, b) for a in planned for b in planned
                 if a is not b and set(links[a.id]) & set(links[b.id])), None)
    assert pair is not None, "the stream must have two requests sharing a fabric link"
    a, b = pair
    clock = iter(range(1000)).__next__
    unlimited = pd.CreditGate([a, b], 4, clock=lambda: float(clock()))
    assert unlimited.gate(_Flow(f"{a.id}-r0")) and unlimited.gate(_Flow(f"{b.id}-r0"))
    gate = pd.CreditGate([a, b], 4, clock=lambda: float(clock()), path_limit=1)
    assert gate.gate(_Flow(f"{a.id}-r0"))
    assert not gate.gate(_Flow(f"{b.id}-r0")), "b's D has credit but a shared link has not"
    for rank in range(len(a.flow_ids)):
        gate.done(_result(f"{a.id}-r{rank}", 0, 1))
    assert gate.gate(_Flow(f"{b.id}-r0"))
    assert max(gate.credits.peak_link.values()) == 1
