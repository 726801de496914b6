"""failure-scale on the flow-level model, at a small scale."""

import pytest

from emu.experiments import failure_scale as fs
from topologies import registry
from traffic import failover
from traffic.flows import FlowDag
from traffic.model import calibration
from traffic.model.dag import replay_dag

#: HPN with two segments of 16 servers (radix 16), the second half full: a
#: DP ring (and an EP group) of 3 servers, 15-16-17, spans both, so a ToR of
#: segment 0 has ring flows with exactly one end behind it.
SMALL_HPN = dict(gpus=192, fabrics=["hpn"], dp=3, ep=3, dp_bytes=1e7, ep_bytes=1e6,
                 radix=16, failed_switch="auto", coalesce=0.01)


def test_hpn_flow_between_segments_with_one_end_behind_the_failed_tor_finishes():
    """HPN's planes never meet: a ring flow whose end behind the failed ToR
    fails over to the other plane takes its other end there too (the P/D
    failure's rule, `failover.FlowEnds`), so the failed iteration finishes
    instead of leaving the flow on the blackhole between the planes."""
    fabric = registry.build(fs.fabric_spec("hpn", SMALL_HPN))
    dag = fs.workload(fs.gpu_ports(fabric), SMALL_HPN)
    tor = failover.busiest_tor(fabric, [(f.src, f.dst, f.bytes) for f in dag.flows])
    moves = failover.failover_map(fabric, [tor])
    segment = {h: fabric.graph.nodes[h]["pod"] for h in fabric.hosts}
    one_end = [f for f in dag.flows if (f.src in moves) != (f.dst in moves)
               and segment[f.src] != segment[f.dst]]
    assert one_end, "a flow between segments with one end behind the failed ToR"
    logged = []
    row = fs.model_fabric("hpn", SMALL_HPN, calibration.load().for_real_world(400.0),
                          logged.append)
    assert row["failed_switch"] == tor and row["ports_moved_count"] == len(moves)
    assert row["flows_count"] == len(dag.flows)
    assert 0 < row["iteration_healthy_s"] <= row["iteration_failed_s"] + 1e-12
    assert 0 <= row["throughput_degradation_pct"] < 100
    assert len(logged) == 1 and "hpn" in logged[0]


#: ZCube(16, 2) at 256 GPUs: 32 servers, DP rings of 8 servers and EP groups
#: of 4 on every rail.
SMALL_ZCUBE = dict(gpus=256, fabrics=["zcube"], dp=8, ep=4, dp_bytes=1e8, ep_bytes=1e6,
                   radix=64, failed_switch="auto", coalesce=0.0)


def test_zcube_flows_take_zcubes_own_paths_and_run_at_the_port_rate():
    """On ZCube a GPU sends on port (local rank mod 2) to its peer's other
    port: one A-B link a pair (ZCube's two paths), so no two ring flows share
    a link and the DP ring runs at the port's rate, as on HPN.  Same port to
    same port took B -> A -> B over hashed links and collided."""
    fabric = registry.build(fs.fabric_spec("zcube", SMALL_ZCUBE))
    ports = fs.gpu_ports(fabric)
    dag = fs.workload(ports, SMALL_ZCUBE, other_port=True)
    port_of = {nic: i for nics in ports.values() for i, nic in enumerate(nics)}
    assert all(port_of[f.src] != port_of[f.dst] for f in dag.flows)
    cal = calibration.IDEAL
    rings = FlowDag([f for f in dag.flows if f.group.startswith("dp")])
    results = replay_dag(fabric, rings, lambda g: g * 1e9, cal)
    gbps = next(iter(fabric.graph.edges(fabric.hosts[0], data=True)))[2]["gbps"]
    steps = 2 * (SMALL_ZCUBE["dp"] - 1)
    ideal = steps * SMALL_ZCUBE["dp_bytes"] * 8 / (gbps * 1e9)
    assert max(r.end for r in results) == pytest.approx(ideal, rel=1e-6)
    same_port = FlowDag([f for f in fs.workload(ports, SMALL_ZCUBE).flows
                            if f.group.startswith("dp")])
    assert max(r.end for r in replay_dag(fabric, same_port, lambda g: g * 1e9, cal)) > ideal
