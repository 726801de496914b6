"""The rfabric scenario end to end: two RL iterations on the rfabric fabric with the
control proxy; iteration 2 must expose less reconfiguration time than iteration 1."""

from __future__ import annotations

import csv
import statistics

import pytest

from tests.integration.utils import assert_no_leftovers, run_ok

pytestmark = pytest.mark.require_root


def test_rfabric_proxy_hides_reconfiguration_in_iteration_2(tmp_path, dataplane):
    run, result = run_ok("rfabric", tmp_path, f"dataplane={dataplane}", "rfabric.fabrics=rfabric",
                         "rfabric.iterations=2",
                         files=("report.md", "flows.csv", "timeline.png", "steps.png",
                                "rfabric/controller.log"), timeout_s=300)
    assert list((run / "rfabric" / "dumps").glob("*.txt")), "no switch dumps at teardown"
    assert "Traceback" not in (run / "rfabric" / "controller.log").read_text()
    rows = [r for r in result["metrics"]["iterations"] if r["fabric"] == "rfabric"]
    assert [r["iteration"] for r in rows] == [1, 2]
    first, second = rows
    assert first["exposed_s"] > 0, f"profiling reconfigures on demand: {first}"
    assert second["exposed_s"] < first["exposed_s"], \
        f"iteration 2 should expose less reconfiguration time: {first} vs {second}"
    assert second["proxy_hidden_s"] > 0, second
    modes = {(r["iteration"], r["mode"]) for r in result["metrics"]["reconfigurations"]}
    assert (1, "reactive") in modes and (2, "proactive") in modes, modes
    # The default workload (toy-moe-16): gen-ep and gen-af (Small windows) ride,
    # with throughput series of their own in the timeline.
    reconfigured = {r["phase"] for r in result["metrics"]["reconfigurations"]}
    assert not reconfigured & {"gen-ep", "gen-af"}, reconfigured
    series = {s["label"] for s in result["timeline"]["series"]}
    assert {"gen-ep", "gen-af"} <= series, series
    dark = result["timeline"]["dark_windows"]
    assert dark and all(w["end"] > w["start"] for w in dark), dark
    assert result["dataplane"] == dataplane and "cpu" in result["fidelity"]
    # A phase's time is its flows': its first flows are armed before it starts
    # (on the run's host agents) and it ends at its last flow's end.  Before,
    # each phase spent 0.4-2.4 s starting agents and up to 0.6 s stopping them.
    flows = list(csv.DictReader((run / "flows.csv").open()))
    gaps = []
    for span in result["timeline"]["phase_spans"]:
        if span["iteration"] != 2:
            continue
        mine = [f for f in flows if f["id"].startswith(f"rfabric-i2-{span['phase']}-")]
        assert mine, span
        first = min(float(f["start_s"]) for f in mine)
        last = max(float(f["end_s"]) for f in mine)
        assert 0 <= span["end"] - last < 0.1, (span, last)
        gaps.append(first - span["start"])
    # Most phases send at once; one (the pipeline's) waits for compute first.
    assert len(gaps) == 7 and statistics.median(gaps) < 0.1, gaps
    assert_no_leftovers()
