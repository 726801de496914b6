"""The cost and fabrics plots: drawn by emu.report from result.json, inlined in report.html."""

import json

import pytest

from emu.report import main, write_report
from emu.report.fabric_plots import (COST_SHARE_PNG, SHARE_KEY, cost_figure, plot_fabric_counts,
                                     write_fabric_plots)
from test_report import PNG_SIGNATURE, write_run


def cost_result():
    """What the cost experiment records: one row per (radix, GPU count, fabric)."""
    rows = []
    for radix in (64, 128):
        for gpus in (1024, 2048, 4096):
            for fabric, label, per_gpu in (("clos", "FT", 300.0), ("roft", "ROFT", 300.0),
                                           ("rfabric", "RFabric", 170.0)):
                rows.append({"radix": radix, "gpus": gpus, "fabric": fabric, "label": label,
                             "cost_million_usd": per_gpu * gpus / 1e6,
                             "cost_per_gpu_usd": per_gpu})
    return {"scenario": "cost", "config": {"scenario": {"kind": "cost"}},
            "metrics": {"rows_count": len(rows), "rfabric_over_ft_ratio": 1.79,
                        "network_cost": rows}}


def fabrics_result():
    """What the fabrics experiment records: counts per fabric at one scale."""
    def row(name, switches, ocs, modules, bisection):
        return {"fabric": name, "gpus": 4096, "switches": switches, "cables": modules // 2,
                "optical_modules": modules, "ocs": ocs, "ocs_ports": 64 * ocs,
                "diameter": 4, "bisection_gbps": bisection}
    return {"scenario": "fabrics", "config": {"scenario": {"kind": "fabrics"}},
            "metrics": {"gpus_count": 4096, "radix_count": 64, "built_count": 3,
                        "not_built_count": 1,
                        "fabrics": [row("roft", 320, 0, 24576, 819200),
                                    {"fabric": "zcube", "note": "not built: n must be even"},
                                    row("sip-ocs", 0, 4, 16384, 819200),
                                    row("rfabric", 128, 24, 12288, 409600)]}}


def inlined_images(page: str) -> int:
    return page.count('<img src="data:image/png;base64,')


def test_cost_plots_are_drawn_from_result_json_and_inlined(tmp_path):
    run = write_run(tmp_path / "cost", result=cost_result(), flows=None)
    written = write_report(run)
    assert [p.name for p in written] == ["report.md", "cost_vs_gpus.png", "cost_per_gpu.png",
                                         "report.html"]
    for png in written[1:-1]:
        assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 10_000
    report = written[0].read_text()
    assert "![cost_vs_gpus.png](cost_vs_gpus.png)" in report
    assert "![cost_per_gpu.png](cost_per_gpu.png)" in report
    assert "Other plots" not in report             # the plots are the report's own
    assert inlined_images(written[-1].read_text()) == 2


def test_cost_rows_without_the_numbers_name_file_key_and_keys(tmp_path, capsys):
    result = cost_result()
    del result["metrics"]["network_cost"][3]["cost_per_gpu_usd"]
    run = write_run(tmp_path / "bad", result=result, flows=None)
    with pytest.raises(ValueError, match=r"result.json: key 'metrics.network_cost\[3\]'.*"
                                         r"cost_per_gpu_usd"):
        write_report(run)
    assert main([str(run)]) == 2
    assert "network_cost[3]" in capsys.readouterr().err


def test_fabrics_plot_shows_each_fabric_at_the_scale_asked(tmp_path):
    run = write_run(tmp_path / "fabrics", result=fabrics_result(), flows=None)
    written = write_report(run)
    assert [p.name for p in written] == ["report.md", "fabric_counts.png", "report.html"]
    assert written[1].read_bytes()[:8] == PNG_SIGNATURE
    assert "![fabric_counts.png](fabric_counts.png)" in written[0].read_text()
    assert inlined_images(written[-1].read_text()) == 1


def test_fabrics_plot_only_for_rows_of_counts(tmp_path):
    # The RL and P/D comparisons name their rows "fabrics" too, with latencies in them.
    rl = {"scenario": "rfabric", "metrics": {"fabrics": [
        {"fabric": "fattree", "normalized_throughput_ratio": 1.0}]}}
    pd = {"scenario": "pd-inference", "metrics": {"fabrics": [
        {"fabric": "hpn", "ttft_p99_s": 1.5, "throughput_emu_rps": 2.0}]}}
    for result in (rl, pd, {"scenario": "x"}, {"scenario": "x", "metrics": {"fabrics": []}}):
        assert write_fabric_plots(result, tmp_path) == []
    assert not list(tmp_path.iterdir())
    # Fabrics that are all "not built" still make a (labelled, empty) plot.
    only_notes = {"scenario": "fabrics", "metrics": {"fabrics": [
        {"fabric": "zcube", "note": "not built", "switches": None, "optical_modules": None}]}}
    assert plot_fabric_counts(only_notes, tmp_path / "x.png") == tmp_path / "x.png"


def test_an_old_cost_run_keeps_its_plots_as_other_plots(tmp_path):
    # Runs recorded before result.json held the cost rows: their PNGs are linked.
    result = cost_result()
    del result["metrics"]["network_cost"]
    run = write_run(tmp_path / "old", result=result, flows=None)
    (run / "cost_vs_gpus.png").write_bytes(PNG_SIGNATURE + bytes(16))
    written = write_report(run)
    assert [p.name for p in written] == ["report.md", "report.html"]
    assert "Other plots: [cost_vs_gpus.png](cost_vs_gpus.png)" in written[0].read_text()
    assert json.loads((run / "result.json").read_text()) == result


def share_result():
    """Cost rows with the share of the GPU cost: FT and ROFT are the same line."""
    result = cost_result()
    for row in result["metrics"]["network_cost"]:
        row[SHARE_KEY] = row["cost_per_gpu_usd"] / 30000 * 100
        row["gpu_price_usd"] = 30000.0
    return result


def test_share_of_gpu_cost_plot_is_written_with_ft_and_roft_both_visible(tmp_path):
    result = share_result()
    run = write_run(tmp_path / "share", result=result, flows=None)
    written = write_report(run)
    assert [p.name for p in written] == ["report.md", "cost_vs_gpus.png", "cost_per_gpu.png",
                                         COST_SHARE_PNG, "report.html"]
    assert written[3].read_bytes()[:8] == PNG_SIGNATURE and written[3].stat().st_size > 10_000
    assert f"![{COST_SHARE_PNG}]({COST_SHARE_PNG})" in written[0].read_text()

    figure = cost_figure(result["metrics"]["network_cost"], SHARE_KEY, "share (%)", log_y=False)
    for axes in figure.axes:                       # one panel per radix
        lines = {line.get_label(): line for line in axes.get_lines()}
        assert set(lines) == {"FT", "ROFT (= FT, shifted right)", "RFabric"}
        ft, roft = lines["FT"], lines["ROFT (= FT, shifted right)"]
        assert list(roft.get_ydata()) == list(ft.get_ydata())        # the same values ...
        assert all(r > f for r, f in zip(roft.get_xdata(), ft.get_xdata()))   # ... shifted
        assert roft.get_xdata()[0] / ft.get_xdata()[0] < 1.1         # by a little
        assert roft.get_linestyle() == "--" and roft.get_markerfacecolor() == "none"
        assert (ft.get_marker(), ft.get_linestyle()) != (roft.get_marker(), "--")
        legend = [text.get_text() for text in axes.get_legend().get_texts()]
        assert "FT" in legend and "ROFT (= FT, shifted right)" in legend
        assert axes.get_ylim()[0] == 0
