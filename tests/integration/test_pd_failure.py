"""A ToR fails from Mininet in the middle of a P/D stream on ZCube: the controller sees the
ports go down and reroutes, the flows behind the ToR move to the GPUs' other NIC ports, and
every request is still served."""

from __future__ import annotations

import pytest

from tests.integration.utils import assert_no_leftovers, run_ok

pytestmark = pytest.mark.require_root


def test_tor_failure_mid_stream_on_zcube_serves_every_request(tmp_path, dataplane):
    # The ToR fails when request 5 arrives, while the first requests' KV flows
    # run: the controller sees it within tens of ms, and at the middle request
    # (4, 0.17 s) no KV flow had started yet, so none was cancelled and resent.
    run, result = run_ok("pd-failure", tmp_path, f"dataplane={dataplane}",
                         "pd-failure.fabrics=zcube", "pd-failure.requests=8",
                         "pd-failure.fail_after=5", "pd-failure.repeats=2",
                         files=("report.md", "flows.csv", "pd_failure.png",
                                "zcube/controller.log"), timeout_s=300)
    metrics = result["metrics"]
    zcube = metrics["zcube"]
    assert zcube["served_count"] == zcube["requests_count"] == 16, "8 requests, 2 repeats"
    assert zcube["repeats_count"] == 2
    assert zcube["moved_flows_count"] >= 1 and zcube["stranded_flows_count"] == 0, zcube
    assert zcube["nic_ports_failed_over_count"] == 4, "a ZCube switch serves n = 4 NIC ports"
    assert 0 < zcube["control_notice_ms"] < 5000, zcube
    assert zcube["throughput_degradation_pct"] is not None
    for run_name in ("healthy", "failure"):
        for repeat in (1, 2):
            rows = [r for r in metrics["requests"] if r["run"] == run_name
                    and r["repeat"] == repeat]
            assert len(rows) == 8 and all(r["served"] for r in rows), rows
    for repeat in (1, 2):   # the second repeat fails a ToR that was brought back up
        moved = [r for r in metrics["requests"] if r["run"] == "failure"
                 and r["repeat"] == repeat and r["moved_flows_count"]]
        assert moved, f"repeat {repeat}: some request must have had a flow moved"
    assert all(r["moved_flows_count"] == 0 for r in metrics["requests"]
               if r["run"] == "healthy")
    windows = {(w["run"], w["window"]) for w in metrics["windows"] if w["repeat"] == 2}
    assert windows == {("healthy", "before"), ("healthy", "after"), ("failure", "before"),
                       ("failure", "after")}
    log = (run / "zcube" / "controller.log").read_text()
    switch = zcube["failed_switch"]
    assert f"link {switch}-" in log and "went down" in log and "went up" in log, log[-2000:]
    assert "Traceback" not in log
    assert_no_leftovers()
