"""A short pd-inference on ZCube end to end: every request served through real KV flows,
TTFT percentiles ordered, never more KV streams into a D than its credits."""

from __future__ import annotations

import csv


import pytest

from tests.integration.utils import assert_no_leftovers, run_ok
from topologies import rail_fabric, registry
from traffic import fastlane

pytestmark = pytest.mark.require_root


def test_pd_inference_short_on_zcube(tmp_path, dataplane):
    run, result = run_ok("pd-inference", tmp_path, f"dataplane={dataplane}",
                         "pd-inference.fabrics=zcube", "pd-inference.requests=10",
                         "pd-inference.d_credits=2",
                         files=("report.md", "flows.csv", "ttft_cdf.png", "pd_bars.png",
                                "d_ingress.png", "zcube/controller.log", "zcube/links.csv"),
                         timeout_s=240)
    # One capture of every switch port: in the root namespace on OVS, one per
    # switch namespace on the kernel data plane.
    captures = sorted((run / "zcube" / "captures").glob("links*.pcap"))
    assert len(captures) == (1 if dataplane == "ovs" else 8), captures
    metrics = result["metrics"]
    zcube = metrics["zcube"]
    assert zcube["requests_count"] == 10 and zcube["served_count"] == 10, zcube
    requests = [r for r in metrics["requests"] if r["fabric"] == "zcube"]
    assert len(requests) == 10 and all(r["served"] for r in requests), requests
    for r in requests:
        assert r["ttft_s"] >= r["prefill_s"] + r["kv_s"] - 1e-6, r
    assert 0 < zcube["ttft_p50_s"] <= zcube["ttft_p95_s"] <= zcube["ttft_p99_s"], zcube
    assert zcube["throughput_emu_rps"] > 0 and zcube["kv_p99_s"] > 0
    streams = [s for s in metrics["d_streams"] if s["fabric"] == "zcube"]
    assert streams and sum(s["requests_count"] for s in streams) == 10
    for s in streams:
        assert 1 <= s["peak_streams_count"] <= s["credit_limit_count"] == 2, s
    assert zcube["credit_peak_per_d_count"] <= 2
    ingress = [r for r in metrics["d_ingress"] if r["fabric"] == "zcube"]
    assert ingress and max(r["streams_count"] for r in ingress) == \
        max(s["peak_streams_count"] for s in streams)
    assert all(r["streams_count"] >= 0 for r in ingress) and ingress[-1]["streams_count"] == 0
    hottest = [r for r in metrics["hottest_links"] if r["fabric"] == "zcube"]
    assert hottest and hottest[0]["bytes"] > 0 and 0 < hottest[0]["utilisation"] <= 1.2, hottest
    # The capture saw every KV byte leave its sender: host -> switch links carry at
    # least the flows' payload (frames add headers).
    with open(run / "flows.csv") as stream:
        flows = list(csv.DictReader(stream))
    with open(run / "zcube" / "links.csv") as stream:
        links = list(csv.DictReader(stream))
    senders = {f["src"] for f in flows}
    sent = sum(int(link["bytes"]) for link in links if link["src"] in senders)
    payload = sum(int(f["bytes"]) for f in flows)
    lost = any("dropped by kernel" in w for w in result["warnings"])
    assert (0.9 if lost else 1.0) * payload <= sent <= 1.3 * payload, (payload, sent, lost)
    assert "Traceback" not in (run / "zcube" / "controller.log").read_text()
    assert_no_leftovers()


def test_rail_fabric_large_kv_rides_reserved_fast_lanes(tmp_path, dataplane):
    run, result = run_ok("pd-inference", tmp_path, f"dataplane={dataplane}",
                         "pd-inference.fabrics=rail-fabric", "pd-inference.requests=8",
                         files=("rail-fabric/links.csv",), timeout_s=240)
    rail = result["metrics"]["rail-fabric"]
    assert rail["served_count"] == 8, rail
    assert rail["large_requests_count"] >= 1 and rail["lane_flows_count"] >= 1, rail
    assert rail["lane_peak_count"] <= rail["lane_capacity_count"] == 1, rail
    # Destination routes keep off the lanes, so what crosses a lane was pinned onto it:
    # the lanes carry at least the lane flows' payload and nothing near all the KV.
    fabric = registry.build(fastlane.rail_fabric_spec(16, 2))
    lanes = {frozenset((a, b)) for a, _, b, _ in rail_fabric.fast_lane_ports(fabric)}
    with open(run / "rail-fabric" / "links.csv") as stream:
        on_lanes = sum(int(row["bytes"]) for row in csv.DictReader(stream)
                       if frozenset((row["src"], row["dst"])) in lanes)
    with open(run / "flows.csv") as stream:
        flows = list(csv.DictReader(stream))
    assert on_lanes > 0
    total = sum(int(f["bytes"]) for f in flows)
    assert on_lanes < 1.3 * total, (on_lanes, total)
    assert "Traceback" not in (run / "rail-fabric" / "controller.log").read_text()
    assert_no_leftovers()
