"""The rfabric scenario end to end: two RL iterations on the rfabric fabric with the
control proxy; iteration 2 must expose less reconfiguration time than iteration 1."""

from __future__ import annotations


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
    dark = result["timeline"]["dark_windows"]
    assert dark and all(w["end"] > w["start"] for w in dark), dark
    assert result["dataplane"] == dataplane and "cpu" in result["fidelity"]
    assert_no_leftovers()
