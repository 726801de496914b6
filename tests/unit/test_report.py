"""Tests for emu.report on a synthetic results folder."""

import csv
import json

import pytest

from emu.report import (FLOW_COLUMNS, load_flows, main, metric_unit,
                        write_report)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

SATURATION_WARNING = ("datapath saturated: ovs-vswitchd reached 97 % of one core "
                      "(mean 80 %), at or above 90 %")
FLOW_WARNING = ("flow f3 had its links to itself but reached 41.0 Mbit/s of "
                "its 100.0 Mbit/s cap (ratio 0.41 < 0.90)")


def synthetic_result():
    series = []
    for label, rate in (("h1->h2", 95.0), ("h3->h4", 60.0)):
        points = []
        for step in range(60):
            t = step * 0.5
            dark = 10.0 <= t < 18.0
            points.append([t, 0.0 if dark else rate])
        series.append({"label": label, "points": points})
    return {
        "scenario": "ocs-reconfig",
        "description": "Ring all-reduce across a circuit change.",
        "started": "2025-11-22T00:31:00+00:00",
        "duration_s": 30.0,
        "versions": {"openvswitch": "3.1.0", "os-ken": "4.2.2", "mininet": "2.3.0.dev6"},
        "datapath": "netdev",
        "ecmp_seed": 7,
        "scale": {"bw_factor": 1e-3, "tdf": 400.0},
        "fabric": {"spec": "hybrid,k=4", "hosts": 8, "switches": 6, "ocs": 1,
                   "link_mbps": 100.0},
        "config": {"fabric": "hybrid,k=4", "ocs": {"delay_real_ms": 20}},
        "metrics": {
            "blackout_ms": 8012.5,
            "ocs_delay_real_ms": 20.0,
            "iteration_s": 28.25,
            "goodput_mbps": 93.5,
            "bytes_moved_bytes": 4e8,
            "link_utilisation_pct": 71.25,
            "flows_count": 4,
            "tag": "baseline",
            "blackouts_ms": [8012.5, 7990.0],
            "ocs": {"reconfigurations_count": 2},
            "per_reconfig": [
                {"index": 0, "blackout_ms": 8012.5, "recovery_ms": 420.0},
                {"index": 1, "blackout_ms": 7990.0, "recovery_ms": 380.0},
            ],
        },
        "timeline": {
            "t0": 1_700_000_000.0,
            "series": series,
            "dark_windows": [{"start": 10.0, "end": 18.0, "label": "o1 reconfig"}],
        },
        "steps": [{"label": f"step {i}", "duration_s": 3.0 + 0.25 * i}
                  for i in range(6)],
        "fidelity": {
            "cpu": {"machine_cpu_pct": {"mean": 61.0, "max": 88.0}, "cores": 2,
                    "processes": {"ovs-vswitchd": {"mean_pct_of_core": 80.0,
                                                   "max_pct_of_core": 97.0}},
                    "samples": 60, "interval_s": 0.5},
            "flows_checked": 4,
            "alone_flows": [{"id": "f3", "goodput_mbps": 41.0, "cap_mbps": 100.0,
                             "ratio": 0.41, "ok": False}],
            "warnings": [SATURATION_WARNING, FLOW_WARNING],
            "saturated": True,
        },
        "warnings": ["controller log held 1 warning line", SATURATION_WARNING],
    }


FLOWS = [
    {"id": "f1", "src": "h1", "dst": "h2", "bytes": 100_000_000, "start_s": 0.0,
     "end_s": 9.0, "duration_s": 9.0, "goodput_mbps": 88.9, "retransmits": 3,
     "status": "ok"},
    {"id": "f2", "src": "h3", "dst": "h4", "bytes": 100_000_000, "start_s": 0.5,
     "end_s": 14.0, "duration_s": 13.5, "goodput_mbps": 59.3, "retransmits": 0,
     "status": "ok"},
    {"id": "f3", "src": "h5", "dst": "h6", "bytes": 100_000_000, "start_s": 18.0,
     "end_s": 37.5, "duration_s": 19.5, "goodput_mbps": 41.0, "retransmits": 12,
     "status": "ok"},
    {"id": "f4", "src": "h7", "dst": "h8", "bytes": 100_000_000, "start_s": 18.0,
     "end_s": "", "duration_s": "", "goodput_mbps": "", "retransmits": "",
     "status": "failed"},
]


def write_run(folder, result=None, flows=FLOWS):
    folder.mkdir(exist_ok=True)
    (folder / "result.json").write_text(json.dumps(result or synthetic_result()))
    if flows is not None:
        with (folder / "flows.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=FLOW_COLUMNS)
            writer.writeheader()
            writer.writerows(flows)
    return folder


def test_writes_report_and_valid_pngs(tmp_path):
    run = write_run(tmp_path / "run")
    (run / "captures").mkdir()
    (run / "captures" / "h2-eth0.pcap").write_bytes(b"\xd4\xc3\xb2\xa1" + bytes(20))
    written = write_report(run)
    assert [p.name for p in written] == ["report.md", "timeline.png", "steps.png",
                                         "report.html"]
    for png in written[1:-1]:
        assert png.read_bytes()[:8] == PNG_SIGNATURE
        assert png.stat().st_size > 10_000
    report = (run / "report.md").read_text()
    # What was run.
    for text in ("ocs-reconfig", "hybrid,k=4", "Open vSwitch, userspace (netdev) datapath",
                 "x0.001", "x400", "openvswitch 3.1.0",
                 "100 Mbit/s emulated (100 Gbit/s real)",
                 "30 s emulated (75 ms real)",
                 "| **ECMP seed** | 7: every flow's ports (and the kernel routers' hash key)"):
        assert text in report, text
    # Warnings from both places, each once, before the metrics.
    assert report.count(SATURATION_WARNING) == 1
    assert FLOW_WARNING in report and "controller log held 1 warning line" in report
    assert "## Fidelity warnings (3)" in report
    assert report.index("Fidelity warnings") < report.index("Headline metrics")
    # Metrics with units, in both unit systems.
    assert "| `blackout_ms` | 8.01 s | 20 ms |" in report
    # A key that says "real" is a real quantity already: no emulated value.
    assert "| `ocs_delay_real_ms` | - | 20 ms |" in report
    assert "| `goodput_mbps` | 93.5 Mbit/s | 93.5 Gbit/s |" in report
    assert "| `bytes_moved_bytes` | 400 MB | 1.0 GB |" in report
    assert "71.2 %" in report and "| `flows_count` | 4 |" in report
    assert "| `ocs.reconfigurations_count` | 2 |" in report
    assert "8.01 s, 7.99 s" in report
    # Tables from list-of-dict metrics.
    assert "### per_reconfig" in report
    assert "| index | blackout (ms) | recovery (ms) |" in report
    assert "| 1 | 7990 | 380 |" in report
    # Flows summary: failed first.
    assert "**4 flows**: 1 failed, 3 ok" in report
    assert "**TCP retransmits**: 15" in report
    flows_part = report[report.index("## Flows"):]
    assert flows_part.index("| f4 |") < flows_part.index("| f3 |") < flows_part.index("| f1 |")
    # CPU and alone-flow tables, links to plots and captures.
    assert "ovs-vswitchd (% of one core) | 80 | 97 |" in report
    assert "![timeline.png](timeline.png)" in report
    assert "![steps.png](steps.png)" in report
    assert "[captures/h2-eth0.pcap](captures/h2-eth0.pcap)" in report
    # No HTML: the configuration is an ordinary section, the last one.
    assert "<details>" not in report and "<summary>" not in report
    assert report.index("## Files") < report.index("## Resolved configuration")


def test_resolved_configuration_is_the_last_section(tmp_path):
    result = synthetic_result()
    result["config"]["odd"] = "```\n</details>\n~~~"
    run = write_run(tmp_path / "run", result=result)
    report = write_report(run)[0].read_text()
    section = report[report.index("## Resolved configuration"):]
    assert section.splitlines()[:4] == [
        "## Resolved configuration", "",
        "The scenario as run, overrides included, as recorded under `config` in "
        "[result.json](result.json):", ""]
    # The JSON, sorted and indented, is the report's last block: a fenced one that
    # no value in it can close early (its line breaks stay escaped in JSON strings).
    body = section.split("```json\n", 1)[1]
    assert body.endswith("\n```\n") and json.loads(body[:-len("```\n")]) == result["config"]
    assert '"odd": "```\\n</details>\\n~~~"' in body
    assert [line for line in body.splitlines() if line.startswith(("```", "~~~"))] == ["```"]
    # Without a configuration there is no section.
    run = write_run(tmp_path / "bare", result={"scenario": "smoke"}, flows=None)
    assert "Resolved configuration" not in write_report(run)[0].read_text()


def test_a_calculation_has_a_plain_duration_and_no_empty_plots(tmp_path):
    # What cost, fabrics and pd-calc record: no fabric, no scale, nothing to plot.
    result = {"scenario": "pd-calc", "duration_s": 0.193, "config": {"a": 1},
              "metrics": {"x_count": 3}, "steps": [{"label": "a", "duration_s": 1.5}]}
    run = write_run(tmp_path / "calc", result=result, flows=None)
    written = write_report(run)
    assert [p.name for p in written] == ["report.md", "steps.png", "report.html"]
    report = written[0].read_text()
    assert "| **Duration** | 193 ms |" in report
    assert "1 steps, 1.5 s in total" in report
    assert " real)" not in report and "emulated (" not in report
    assert "## Plots" in report               # steps.png is a plot
    (run / "steps.png").unlink()
    result.pop("steps")
    run = write_run(run, result=result, flows=None)
    written = write_report(run)
    assert [p.name for p in written] == ["report.md", "report.html"]
    report = written[0].read_text()
    assert "## Plots" not in report
    assert "## Headline metrics" in report and "## Flows" in report
    # An emulated run keeps both durations.
    run = write_run(tmp_path / "emulated", result=dict(result, scale={"tdf": 10.0}),
                    flows=None)
    assert "| **Duration** | 193 ms emulated (19.3 ms real) |" in \
        write_report(run)[0].read_text()


def test_minimal_result_still_reports(tmp_path):
    run = write_run(tmp_path / "bare", result={"scenario": "smoke"}, flows=None)
    written = write_report(run)
    # No fabric and no timeline: a calculation, with no empty plot.
    assert [p.name for p in written] == ["report.md", "report.html"]
    report = written[0].read_text()
    assert "builds no network" in report
    assert "# Run report: smoke" in report
    assert "No fidelity check was recorded" in report
    assert "No flows.csv in the run folder." in report
    assert "| metric | value |" not in report      # no metrics, no table
    # A run with the identity scale prints one value column.
    run = write_run(tmp_path / "identity", result={
        "scenario": "plain", "metrics": {"rtt_ms": 0.5}, "fidelity": {"warnings": []}})
    report = write_report(run)[0].read_text()
    assert "| `rtt_ms` | 500 us |" in report
    assert "## Fidelity warnings (0)" in report


def test_bad_inputs_name_file_and_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="no result.json"):
        write_report(tmp_path)
    run = write_run(tmp_path / "bad", result={"scenario": "x", "steps": [{"label": "a"}]})
    with pytest.raises(ValueError, match=r"result.json: key 'steps\[0\]'"):
        write_report(run)
    run = write_run(tmp_path / "bad2", result={"scenario": "x", "scale": {"tdf": 0}})
    with pytest.raises(ValueError, match="key 'scale' tdf must be a positive"):
        write_report(run)
    (tmp_path / "bad3").mkdir()
    (tmp_path / "bad3" / "result.json").write_text(json.dumps({"scenario": "x"}))
    (tmp_path / "bad3" / "flows.csv").write_text("id,src\nf1,h1\n")
    with pytest.raises(ValueError, match=r"flows.csv: missing column\(s\)"):
        load_flows(tmp_path / "bad3")
    assert main([str(tmp_path / "nowhere")]) == 2


def test_metric_units():
    assert metric_unit("blackout_ms").unit == "ms"
    assert metric_unit("blackout_ms").kind == "time"
    assert metric_unit("a.b.rate_gbps").name == "a.b.rate"
    assert metric_unit("delay_real_s").is_real
    assert metric_unit("status").kind == "unknown"
    assert metric_unit("_s").kind == "unknown"


def test_notes_are_prose_after_the_figures_not_a_metric():
    from emu.report import markdown
    from traffic.scale import Scale

    result = {"metrics": {"x_s": 1.0, "notes": ["why x is what it is", "and y"]}}
    scale = Scale.from_rates(100, 10)
    metrics = "\n".join(markdown._metrics_section(result, scale))
    assert "why x" not in metrics and "`x_s`" in metrics
    assert markdown._notes_section(result) == ["## Reading the figures", "",
                                               "- why x is what it is", "- and y", ""]
    assert markdown._notes_section({"metrics": {}}) == []


def test_metrics_named_real_are_real_quantities_only(tmp_path):
    # rfabric records each iteration in emulated s and in real ms (tdf 100).
    result = {
        "scenario": "rfabric", "scale": {"bw_factor": 1e-3, "tdf": 100.0},
        "metrics": {
            "fattree": {"iteration_s": 21.1, "iteration_real_ms": 211.0},
            "delays_real_ms": [20.0, 30.0],
            "samples_real_ms": [float(value) for value in range(1, 21)],
            "iterations": [{"fabric": "fattree", "iteration_s": 21.1,
                            "iteration_real_ms": 211.0}],
        }}
    run = write_run(tmp_path / "rfabric", result=result, flows=None)
    report = write_report(run)[0].read_text()
    assert "| `fattree.iteration_s` | 21.1 s | 211 ms |" in report
    assert "| `fattree.iteration_real_ms` | - | 211 ms |" in report
    assert "| `delays_real_ms` | - | 20 ms, 30 ms |" in report
    assert ("| `samples_real_ms` | - | min 1.0 ms, median 10.5 ms, max 20 ms "
            "(20 values) |") in report
    # Table columns: a real one is marked as such, and the note says so.
    assert "| fabric | iteration (s) | iteration_real (ms, real) |" in report
    assert "Table values are emulated, except in columns marked real; divide" in report
    # Never a "real" value multiplied back into emulated units: 21.1 s is iteration_s's.
    assert report.count("21.1 s") == 1
    # With the identity scale there is one value column: the value itself.
    run = write_run(tmp_path / "identity", result={
        "scenario": "plain", "metrics": {"delay_real_ms": 20.0, "list_real_s": [1.0, 2.0]}},
        flows=None)
    report = write_report(run)[0].read_text()
    assert "| `delay_real_ms` | 20 ms |" in report
    assert "| `list_real_s` | 1.0 s, 2.0 s |" in report


def test_units_of_real_and_emulated_values():
    from emu.report.units import both_units, column_header, value_list
    from traffic.scale import Scale

    scale = Scale(bw_factor=1e-3, tdf=100.0)
    assert both_units(211.0, metric_unit("iteration_real_ms"), scale) == ("", "211 ms")
    assert both_units(21.1, metric_unit("iteration_s"), scale) == ("21.1 s", "211 ms")
    assert both_units(5, metric_unit("flows_count"), scale) == ("5", "")
    assert value_list([1.0], metric_unit("a_real_gbps"), scale) == ("", "1.0 Gbit/s")
    assert not metric_unit("realtime_s").is_real      # a word, not part of one
    assert column_header("iteration_real_ms") == "iteration_real (ms, real)"
    assert column_header("recovery_ms") == "recovery (ms)"
    assert column_header("share_real_ratio") == "share_real_ratio"   # no unit: the key


def test_a_description_cannot_open_a_block_that_swallows_the_report(tmp_path):
    for description in ("```", "~~~ x", "<details><summary>x</summary>", "# heading",
                        "    ```", "ok\n```", "ok\r```", "> quote", "[r]: javascript:x"):
        run = write_run(tmp_path / "run", result={
            "scenario": "x", "description": description,
            "metrics": {"notes": [description, "fine"]}}, flows=None)
        write_report(run)
        page = (run / "report.html").read_text()
        assert '<h2 id="what-was-run">' in page and '<h2 id="files">' in page
        assert "<li>fine</li>" in page
        assert "<pre>" not in page and page.count("<details>") == 0
        assert page.count("<h1") == 1 and "<blockquote>" not in page


def test_python_m_emu_report_rerenders_a_run(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    run = write_run(tmp_path / "run")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "emu.report",
                           str(run)], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [Path(line).name for line in done.stdout.splitlines()] == [
        "report.md", "timeline.png", "steps.png", "report.html"]
    missing = subprocess.run([sys.executable, "-m", "emu.report", str(tmp_path / "nowhere")],
                             cwd=root, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no result.json" in missing.stderr


def test_kernel_data_plane_fidelity_shows_softirq_drops_and_shared_links(tmp_path):
    result = synthetic_result()
    result["fidelity"]["cpu"]["softirq_pct"] = {"mean": 12.5, "max": 31.0}
    result["fidelity"]["drops"] = {"queue_drops": 17, "veth_drops": 0, "softnet_drops": 0,
                                   "time_squeezes": 2, "vswitchd_hidden": None}
    result["fidelity"].update(paths_known_count=8, flows_sharing_a_link_count=2, shared_links=[
        {"link": "s1->s5", "flows": ["ring-0", "ring-4"], "overlap_s": 3.25}])
    run = write_run(tmp_path / "run", result)
    write_report(run)
    report = (run / "report.md").read_text()
    assert "| softirq: kernel forwarding (% of all cores) | 12.5 | 31 |" in report
    assert "| emulated link queues (congestion) | 17 |" in report
    assert "| ovs-vswitchd send failures (at least) | - |" in report
    assert "path of 8 flows" in report and "2 of them shared a link" in report
    assert "| s1->s5 | ring-0, ring-4 | 3.25 |" in report
    result["fidelity"]["shared_links"] = []
    write_report(write_run(tmp_path / "quiet", result))
    assert "No two of them crossed one link" in (tmp_path / "quiet" / "report.md").read_text()


# ------------------------------------------------------------ ## Web view
def _png(path, size=(4, 3)):
    """A small, valid PNG (report.html inlines only real images)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=size, dpi=10)
    figure.savefig(path, format="png")
    plt.close(figure)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    return path


def _section(report, title):
    start = report.index(f"## {title}")
    end = report.find("\n## ", start + 1)
    return report[start:] if end < 0 else report[start:end]


def test_no_web_view_section_without_events(tmp_path):
    run = write_run(tmp_path / "allreduce-20260101-000000",
                    result={"scenario": "allreduce", "web_view": True}, flows=None)
    report = write_report(run)[0].read_text()
    assert "## Web view" not in report and "emu.view" not in report


@pytest.mark.parametrize("on", [True, False])
def test_web_view_section_says_how_to_replay(tmp_path, on):
    run = write_run(tmp_path / "ocs-reconfig-20260101-000000",
                    result={"scenario": "ocs-reconfig", "web_view": on}, flows=None)
    (run / "events.jsonl").write_text('{"kind": "run", "t": 1.0, "status": "ended"}\n')
    report = write_report(run)[0].read_text()
    section = _section(report, "Web view")
    assert f"The web view was {'on' if on else 'off'} during this run" in section
    assert "`python -m emu.view ocs-reconfig-20260101-000000`" in section
    assert "[events.jsonl](events.jsonl)" in section
    assert "![" not in section                       # no screenshot saved
    assert report.index("## Web view") < report.index("## Flows") < report.index("## Files")
    assert "[events.jsonl](events.jsonl)" in _section(report, "Files")


def test_web_view_section_without_the_field_says_off(tmp_path):
    """A run recorded before result.json had web_view: it was off."""
    run = write_run(tmp_path / "run", result={"scenario": "x"}, flows=None)
    (run / "events.jsonl").write_text("")
    report = write_report(run)[0].read_text()
    assert "The web view was off during this run" in _section(report, "Web view")


def test_the_web_view_screenshot_is_shown_once(tmp_path):
    run = write_run(tmp_path / "run", result={"scenario": "x", "web_view": True}, flows=None)
    (run / "events.jsonl").write_text("")
    _png(run / "web-view.png")
    written = write_report(run)
    report = written[0].read_text()
    assert "![The web view during the run](web-view.png)" in _section(report, "Web view")
    assert report.count("web-view.png") == 1, "embedded, not listed again under Files"
    html = written[-1].read_text()
    assert "data:image/png;base64," in html            # inlined in report.html
    assert 'src="web-view.png"' not in html


def test_a_screenshot_without_events_is_still_listed(tmp_path):
    """No events.jsonl, no Web view section: the PNG is then an ordinary file."""
    run = write_run(tmp_path / "run", result={"scenario": "x"}, flows=None)
    _png(run / "web-view.png")
    report = write_report(run)[0].read_text()
    assert "## Web view" not in report
    assert "[web-view.png](web-view.png)" in _section(report, "Files")
