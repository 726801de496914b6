"""The kept-connection transport with real agent processes on loopback addresses (no root):
the agents, their connections, the flows' framing, the local and relayed
dependencies are all real (`loopback_bed`)."""

from __future__ import annotations

import io
import json

import pytest
from loopback_bed import LoopbackBed, owned_processes  # noqa: F401  (an autouse fixture)

from emu.live import peer_agent
from emu.live.peer_replay import AGENT_PORT, PeerReplayer
from traffic.flows import Flow, FlowDag, ring_allreduce

def test_a_ring_all_reduce_moves_every_chunk_after_what_it_waits_for():
    hosts = ["a", "b", "c"]
    dag = ring_allreduce(hosts, 3 * 200_000)
    replayer = PeerReplayer(LoopbackBed(hosts), dag, 1000.0)
    assert not any(replayer.listeners().values()), \
        "every step of a ring waits only for what its source received or sent it just before"
    results = {r.id: r for r in replayer.run()}
    assert [r.status for r in results.values()] == ["ok"] * len(dag.flows), results
    # One kept connection per pair of hosts, from the port the seed draws for it.
    ports = replayer.source_ports([f.id for f in dag.topological_order()])
    assert len(set(ports.values())) == len(ports) == 3 and 0 not in ports.values()
    for flow in dag.flows:
        row = results[flow.id]
        assert row.bytes_received == flow.bytes and row.end > row.start >= replayer.t0, row
        assert (row.sport, row.dport) == (ports[flow.src, flow.dst], AGENT_PORT), row
        for dep in flow.after:
            if dag.by_id()[dep].dst == flow.src:
                assert row.start >= results[dep].end, f"{flow.id} left before {dep} arrived"


def test_a_run_right_after_another_reopens_its_connections_from_the_same_ports():
    dag = FlowDag([Flow("f1", "a", "b", 100_000), Flow("f2", "b", "a", 100_000)])

    def sports(seed):
        results = PeerReplayer(LoopbackBed(["a", "b"], ecmp_seed=seed), dag, 1000.0).run()
        assert all(r.status == "ok" for r in results), results
        return [r.sport for r in results]

    # The first run's connections may still be in TIME_WAIT on these ports.
    assert sports(4) == sports(4) != sports(5)


def test_a_flow_waiting_for_one_received_elsewhere_is_told_by_the_runner():
    bed = LoopbackBed(["a", "b", "c"])
    dag = FlowDag([Flow("f1", "a", "b", 300_000),
                   Flow("f2", "c", "a", 100_000, after=("f1",), at_s=0.2),
                   Flow("f3", "c", "b", 50_000, at_s=0.3)])
    replayer = PeerReplayer(bed, dag, 1000.0)
    assert replayer.listeners() == {"f1": {"c"}, "f2": set(), "f3": set()}
    results = {r.id: r for r in replayer.run()}
    assert all(r.status == "ok" for r in results.values()), results
    assert results["f2"].start >= results["f1"].end + 0.2, "0.2 s after f1 arrived at b"
    assert results["f3"].start >= replayer.t0 + 0.3


class MisplacedAgentBed(LoopbackBed):
    """Host b's agent listens on another port: nobody can reach it."""

    def popen(self, host, args, what, **kwargs):
        if host == "b":
            args = [str(AGENT_PORT + 1) if a == str(AGENT_PORT) else a for a in args]
        return super().popen(host, args, what, **kwargs)


def test_a_failed_flow_stops_the_replay_and_what_waits_for_it_says_why():
    dag = FlowDag([Flow("f1", "a", "b", 10_000), Flow("f2", "b", "a", 10_000, after=("f1",))])
    results = {r.id: r for r in PeerReplayer(MisplacedAgentBed(["a", "b"]), dag, 1000.0).run()}
    assert results["f1"].status == "failed" and "Connection refused" in results["f1"].error
    assert (results["f2"].status, results["f2"].error) == \
        ("failed", "not run: the replay stopped when f1 failed")


def test_paced_flows_are_refused_before_any_process_starts():
    dag = FlowDag([Flow("f1", "a", "b", 10_000, rate_mbps=5.0)])
    with pytest.raises(ValueError, match="paced"):
        PeerReplayer(LoopbackBed(["a", "b"]), dag, 1000.0)


def test_an_unreachable_peer_is_an_error_event_naming_the_flow():
    out = io.StringIO()
    agent = peer_agent.Agent(out=out)
    agent.send({"op": "flow", "id": "f9", "dst": "127.0.0.1", "port": 9, "bytes": 10})
    event = json.loads(out.getvalue().splitlines()[-1])
    assert event["event"] == "error" and event["id"] == "f9", event
    assert "Connection refused" in event["error"], event


def test_the_frame_names_the_flow_and_its_length():
    data = peer_agent.frame("allreduce-s3-r1", 1_250_000)
    name_len, count = peer_agent.HEADER.unpack_from(data)
    assert (count, data[peer_agent.HEADER.size:].decode()) == (1_250_000, "allreduce-s3-r1")
    assert name_len == len("allreduce-s3-r1")
