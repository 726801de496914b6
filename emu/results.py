"""Write a run's raw results: the run folder, result.json and flows.csv.

Analysis and plots (``emu.report``) read these files back; nothing here
computes the report.  The switch dumps and the software versions come from
the testbed (`emu.live.testbed.Testbed.dump_tables`, ``describe``).
"""

from __future__ import annotations

import csv
import json
import os
from datetime import datetime, timezone
from pathlib import Path

FLOW_COLUMNS = ["id", "src", "dst", "bytes", "start_s", "end_s", "duration_s", "goodput_mbps",
                "retransmits", "status", "step", "group", "bytes_received", "error"]


def new_run_dir(out: Path, scenario: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(out) / f"{scenario}-{stamp}"
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = Path(out) / f"{scenario}-{stamp}-{suffix}"
    run_dir.mkdir(parents=True)
    return run_dir


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_flows(run_dir: Path, flows, t0: float) -> Path:
    path = run_dir / "flows.csv"
    with open(path, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=FLOW_COLUMNS)
        writer.writeheader()
        for flow in flows:
            row = flow.to_dict()
            # 0 is "never started" on a live run's epoch clock, but a real time
            # on the model's clock, where a finished flow may start at 0.
            timed = flow.status == "ok"
            row["start_s"] = round(flow.start - t0, 6) if flow.start or timed else ""
            row["end_s"] = round(flow.end - t0, 6) if flow.end or timed else ""
            row["duration_s"] = round(flow.duration_s, 6)
            row["goodput_mbps"] = round(flow.goodput_mbps, 4)
            row["step"] = "" if flow.step is None else flow.step
            writer.writerow({k: row.get(k, "") for k in FLOW_COLUMNS})
    return path


def write_result(run_dir: Path, result: dict) -> Path:
    """result.json, written whole or not at all: a reader (the report, the web
    view, a killed run's successor) never meets half a file."""
    path = run_dir / "result.json"
    temporary = path.with_name(".result.json.tmp")
    temporary.write_text(json.dumps(result, indent=1, sort_keys=False, default=str) + "\n")
    os.replace(temporary, path)
    return path
