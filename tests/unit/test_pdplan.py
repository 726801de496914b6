"""P/D planning: request -> one KV flow per TP rank, the P queue, fast lanes on Rail-Fabric."""

from __future__ import annotations

import pytest

from emu.experiments import pd_setup
from emu.live.replay import FlowResult
from topologies import registry
from traffic import kvcache
from traffic.pdplan import plan, prefill_seconds, request_of
from traffic.scale import Scale

SETTINGS = dict(workload="deep-thinking", requests=12, rate_per_s=10.0, seed=1,
                placement="tiles", tile="3p2d")
SCALE = Scale.from_rates(200, 10, tdf=10)


def _plan(spec="zcube,n=4,gpus_per_server=2", pairing="fixed", ms=10.0):
    """Topology, placement and plan of the 12-request stream of ``SETTINGS`` on ``spec``."""
    topo = pd_setup.topology(registry.build(spec), 2)
    place = pd_setup.make_placement(topo, SETTINGS)
    return topo, place, plan(topo, place, pd_setup.stream_of(SETTINGS), SCALE, pairing, ms, 1)


def _result(fid, start, end, status="ok"):
    """A replayed flow's result, as the replayer records it (epoch s)."""
    r = FlowResult(fid, "a", "b", 100, None, "kv", start=start, end=end)
    r.status = status
    return r


def test_request_maps_to_one_flow_per_rank_rank_to_rank():
    topo, place, planned = _plan()
    assert len(planned) == 12
    for x in planned:
        assert x.p in place.prefill and x.d in place.decode
        flows = x.transfer.dag.flows
        assert [f.id for f in flows] == [f"{x.id}-r0", f"{x.id}-r1"]
        assert all(request_of(f.id) == x.id for f in flows)
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
        real = prefill_seconds(x.request, 10.0)
        assert x.prefill_end_s - x.prefill_start_s == pytest.approx(real * SCALE.tdf)
        last_end[x.p] = x.prefill_end_s


@pytest.mark.parametrize("pairing", ["fixed", "random", "score", "sticky"])
def test_every_pairing_plans_on_zcube_and_roft(pairing):
    for spec in ("zcube,n=4,gpus_per_server=2", "roft,gpus=16,radix=8,gpus_per_server=2"):
        _, _, planned = _plan(spec, pairing)
        assert len(planned) == 12


def test_request_of():
    assert request_of("r000012-r1") == "r000012"
    assert request_of("r0-r10") == "r0"


def test_rail_fabric_plans_large_requests_onto_fast_lanes_and_small_ones_on_the_expander():
    topo = pd_setup.topology(registry.build(pd_setup.fabric_specs(
        "zcube,n=4,gpus_per_server=2", ["rail-fabric"])["rail-fabric"]), 2)
    place = pd_setup.make_placement(topo, SETTINGS)
    stream = pd_setup.stream_of(SETTINGS)
    planned = plan(topo, place, stream, SCALE, "fixed", 10.0, 1)
    assert all(x.lanes is not None for x in planned)
    large = [x for x in planned if x.lanes.large]
    assert large and len(large) < len(planned) or large, "deep-thinking has large requests"
    for x in large:
        kinds = {route.kind for route in x.lanes.routes}
        assert kinds <= {"lane", "local"}, kinds
        for flow, route in zip(x.transfer.dag.flows, x.lanes.routes):
            assert (flow.src, flow.dst) == (route.path[0], route.path[-1])
    everything_small = plan(topo, place, stream, SCALE, "fixed", 10.0, 1,
                            lane_threshold_bytes=float("inf"))
    assert all(not x.lanes.large and {r.kind for r in x.lanes.routes} <= {"expander", "local"}
               for x in everything_small)
