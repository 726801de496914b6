"""Write a run's raw results: result.json, flows.csv, switch dumps.

Analysis and plots (``emu.report``) read these files back; nothing here
computes the report.
"""

from __future__ import annotations

import csv
import json
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Dict, List

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


def versions(ovs_version: str = "") -> Dict[str, str]:
    found = {"python": platform.python_version(), "kernel": platform.release()}
    for package in ("os-ken", "mininet", "iperf3", "scapy", "networkx", "matplotlib"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    if ovs_version:
        found["openvswitch"] = ovs_version
    try:
        found["iperf3 (binary/libiperf)"] = subprocess.run(
            ["iperf3", "--version"], capture_output=True, text=True, timeout=5
        ).stdout.split("\n")[0].strip()
    except (OSError, subprocess.TimeoutExpired):
        found["iperf3 (binary/libiperf)"] = "not found"
    return found


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_flows(run_dir: Path, flows, t0: float) -> Path:
    path = run_dir / "flows.csv"
    with open(path, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=FLOW_COLUMNS)
        writer.writeheader()
        for flow in flows:
            row = flow.to_dict()
            row["start_s"] = round(flow.start - t0, 6) if flow.start else ""
            row["end_s"] = round(flow.end - t0, 6) if flow.end else ""
            row["duration_s"] = round(flow.duration_s, 6)
            row["goodput_mbps"] = round(flow.goodput_mbps, 4)
            row["step"] = "" if flow.step is None else flow.step
            writer.writerow({k: row.get(k, "") for k in FLOW_COLUMNS})
    return path


def write_result(run_dir: Path, result: dict) -> Path:
    path = run_dir / "result.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=False, default=str) + "\n")
    return path


def dump_switches(run_dir: Path, switches: List[str]) -> None:
    """Flow and group tables at teardown, for post-mortems."""
    directory = run_dir / "dumps"
    directory.mkdir(exist_ok=True)
    for switch in switches:
        parts = []
        for what in ("dump-flows", "dump-groups"):
            out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", what, switch],
                                 capture_output=True, text=True, timeout=30)
            parts.append(f"# ovs-ofctl {what} {switch}\n{out.stdout}{out.stderr}")
        (directory / f"{switch}.txt").write_text("\n".join(parts))
