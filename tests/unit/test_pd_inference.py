"""pd-inference's own parts: its schema and the network cost rows (the run is
integration-tested; planning, gates and statistics have their own tests)."""

from __future__ import annotations

from emu.experiments import pd_failure, pd_inference as pd, pd_pairing, pd_setup


def test_cost_rows_note_missing_models():
    rows, notes = pd.cost_rows(["zcube", "roft", "railfly"], 16384, 64)
    assert {r["fabric"] for r in rows} == {"zcube", "roft"}
    assert all(r["cost_total_usd"] > 0 for r in rows)
    assert any("railfly" in n for n in notes)


def test_the_three_scenarios_share_one_definition_of_each_common_setting():
    assert list(pd.FIELDS) == [
        "fabrics", "workload", "requests", "rate_per_s", "seed", "tp", "placement", "tile",
        "pairing", "path_strategy", "d_credits", "path_credits", "prefill_ms_per_ktoken",
        "kv_window", "cost_gpus", "cost_radix", "lane_threshold_gb", "lane_capacity", "lane_when_busy",
        "link_capture", "lock_wait_s"]
    for fields in (pd.FIELDS, pd_failure.FIELDS, pd_pairing.FIELDS):
        for key in ("workload", "seed", "tp", "placement", "tile", "lock_wait_s", "kv_window"):
            assert fields[key] is pd_setup.FIELDS[key], key
