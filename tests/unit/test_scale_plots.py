"""The full-scale runs' plots are drawn from result.json, and only when it holds their rows."""

from emu.report.scale_plots import FAILURE_PNG, FIGURE6_PNG, SWEEP_PNG, write_scale_plots


def test_figure6_sweep_and_failure_bars_are_drawn(tmp_path):
    result = {"scenario": "rfabric-scale", "metrics": {
        "figure6": [{"gpus_count": g, "fabric": f, "normalized_throughput_ratio": v}
                    for g in (2048, 4096) for f, v in (("clos", 1.0), ("rfabric", 0.5))],
        "sweep": [{"gpus_count": 2048, "technology": t, "delay_ms": d, "exposed_first_s": e,
                   "exposed_later_s": e, "normalized_throughput_ratio": 0.5}
                  for t, d, e in (("rotornet", 0.01, 0.0003), ("robotic", 120000.0, 5000.0))],
        "failures": [{"fabric": "zcube", "throughput_degradation_pct": 3.0,
                      "text_degradation_pct": 2.8}]}}
    written = write_scale_plots(result, tmp_path)
    assert sorted(p.name for p in written) == sorted([FIGURE6_PNG, SWEEP_PNG, FAILURE_PNG])
    assert all(p.stat().st_size > 1000 for p in written)


def test_nothing_is_drawn_for_another_run(tmp_path):
    assert write_scale_plots({"scenario": "allreduce", "metrics": {"completion_s": 1.0}},
                             tmp_path) == []
    assert list(tmp_path.iterdir()) == []
