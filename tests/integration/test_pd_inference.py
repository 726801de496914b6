"""A short pd-inference on ZCube end to end: every request served through real KV flows,
TTFT percentiles ordered, never more KV streams into a D than its credits."""

from __future__ import annotations


import pytest

from tests.integration.utils import assert_no_leftovers, run_ok

pytestmark = pytest.mark.require_root


def test_pd_inference_short_on_zcube(tmp_path):
    run, result = run_ok("pd-inference", tmp_path, "pd-inference.fabrics=zcube",
                         "pd-inference.requests=10", "pd-inference.d_credits=2",
                         files=("report.md", "flows.csv", "ttft_cdf.png", "pd_bars.png",
                                "zcube/controller.log"), timeout_s=240)
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
    assert "Traceback" not in (run / "zcube" / "controller.log").read_text()
    assert_no_leftovers()
