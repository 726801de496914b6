"""Figure 6 / phase / Figure 3 analogues from a synthetic rfabric run."""

import copy
import csv
import json

from emu import report
from emu.report.rl_plots import interarrivals, write_rl_plots

PNG = b"\x89PNG\r\n\x1a\n"


# A synthetic rfabric result: two fabrics, two iterations of two phases.
RFABRIC_RESULT = {"scenario": "rfabric", "metrics": {
    "fabrics": [{"fabric": "fattree", "normalized_throughput_ratio": 1.0},
                {"fabric": "rfabric", "normalized_throughput_ratio": 0.95}],
    "phases": [{"fabric": f, "iteration": i, "phase": p, "duration_s": d}
               for f in ("fattree", "rfabric") for i in (1, 2)
               for p, d in (("train-dp", 2.0), ("weight-sync", 5.0))]}}


def _run(tmp_path):
    result = copy.deepcopy(RFABRIC_RESULT)
    (tmp_path / "result.json").write_text(json.dumps(result))
    with open(tmp_path / "flows.csv", "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["id", "src", "dst", "bytes", "start_s", "end_s", "duration_s",
                         "goodput_mbps", "retransmits", "status", "group", "step"])
        for fabric in ("fattree", "fattree-os"):
            for k, start in enumerate((0.0, 1.0, 3.0)):
                for suffix in ("", "b"):
                    writer.writerow([f"{fabric}-i1-train-dp-{k}{suffix}", "h1", "h2", 1000,
                                     start, start + 0.5, 0.5, 10.0, 0, "ok", "train-dp", k])
    return result


def test_interarrivals_per_type_and_fabric(tmp_path):
    _run(tmp_path)
    gaps = interarrivals(tmp_path / "flows.csv")
    # two fabrics kept apart (fattree-os is not fattree), simultaneous flows count once
    assert gaps == {"train-dp": [1.0, 1.0, 2.0, 2.0]}


def test_plots_are_written_and_linked_from_the_report(tmp_path):
    result = _run(tmp_path)
    written = write_rl_plots(result, tmp_path)
    assert [p.name for p in written] == ["normalized.png", "phases.png", "interarrival.png"]
    assert all(p.read_bytes()[:8] == PNG for p in written)
    report.write_report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "normalized.png" in text and "interarrival.png" in text


def test_other_scenarios_get_no_rl_plots(tmp_path):
    assert write_rl_plots({"scenario": "allreduce", "metrics": {"completion_s": 1.0}},
                          tmp_path) == []
