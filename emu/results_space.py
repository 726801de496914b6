"""Room for a run's results: what a run needs on disk, and a check of the folder.

A run that finds its results folder unwritable, or full, finds out after its
network was built, or half way through a capture: tcpdump stops writing, the
report is lost, and the time with it.  `check_results_folder` refuses such a
folder before anything exists (`emu.run` calls it before the run folder, the
lock or the testbed are made), with what the folder has and what the run needs.

What a run needs (`estimate_run_bytes`) is a conservative estimate:

* ``RESULTS_BYTES`` for everything but the captures: result.json, flows.csv,
  events.jsonl, load.csv, switch dumps, logs, report.md/.html and the plots
  (a few MB in the runs measured; 32 MiB leaves room for long ones).
* The captures, the big part, for the kinds that capture (`capture_kind`):
  every captured link saturated in both directions at its emulated rate, for
  ``CAPTURE_SECONDS``, of which ``CAPTURED_SHARE`` reaches the disk.  tcpdump
  keeps the first ``emu.live.capture.SNAPLEN`` (128) bytes of a frame and adds
  a 16-byte record header: 10 % of a full 1,514-byte frame; the ACKs coming
  back are small frames kept whole, hence 15 %.  Two minutes is three times
  the longest capture of a built-in scenario at its defaults (rotor: six runs of
  6 s; ocs-reconfig: four presets with 3 s of traffic around each, 16 s).  A
  scenario set to capture for longer may need more than the estimate.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from topologies.fabric import HOST

RESULTS_BYTES = 32 * 2**20
CAPTURE_SECONDS = 120.0
CAPTURED_SHARE = 0.15
# Kinds whose run captures at its receiving hosts (each builds an
# `emu.live.capture.Capture`); a kind with a ``link_capture`` setting captures
# every switch port when it is on (`emu.live.capture.FabricCapture`).
RECEIVER_CAPTURES = ("ocs-reconfig", "rotor")


class ResultsFolderError(ValueError):
    """The results folder cannot take the run; the message names it and why."""


def capture_kind(scenario) -> Optional[str]:
    """What the scenario's run captures: "links" (every switch port), "hosts"
    (its receivers) or None."""
    if not scenario.emulates:
        return None
    if scenario.section.get("link_capture"):
        return "links"
    return "hosts" if scenario.kind in RECEIVER_CAPTURES else None


def estimate_run_bytes(scenario, fabric=None, scale=None) -> int:
    """Bytes the run of ``scenario`` may write into its run folder (see the
    module's docstring); ``fabric`` and ``scale`` are built when not given."""
    kind = capture_kind(scenario)
    if kind is None:
        return RESULTS_BYTES
    if fabric is None or scale is None:
        from emu.experiments.base import build_fabric, scale_for

        fabric = build_fabric(scenario)
        scale = scale_for(scenario, fabric)
    captured = [data["gbps"] for u, v, data in fabric.links()
                if kind == "links" or HOST in (fabric.kind(u), fabric.kind(v))]
    bytes_per_s = sum(2 * scale.emu_mbps(gbps) * 1e6 / 8 for gbps in captured)
    return RESULTS_BYTES + int(bytes_per_s * CAPTURED_SHARE * CAPTURE_SECONDS)


def check_results_folder(out: Path, needed: int) -> None:
    """Raise ResultsFolderError unless ``out`` (made if missing) can be written
    and has ``needed`` bytes free.  Nothing is created: a folder still to be
    made is judged by the nearest one that exists."""
    out = Path(out)
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is" if existing == out else f"cannot be made: {existing} is"
        raise ResultsFolderError(f"results folder {out} {what} a file, not a folder")
    # access() answers for root too where it matters: a read-only file system
    # (EROFS); statvfs says so by name.
    read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    if read_only or not os.access(existing, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if read_only else "is not writable"
        where = "" if existing == out else f" ({existing}, where it would be made, {why})"
        raise ResultsFolderError(f"results folder {out} cannot be written"
                                 + (where or f": it {why}"))
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise ResultsFolderError(
            f"results folder {out} has {_size(free)} free ({free:,} bytes); this run needs "
            f"about {_size(needed)} ({needed:,} bytes: its captures at full rate for "
            f"{CAPTURE_SECONDS:.0f} s, and its other files); free some space or give "
            "another --out")


def _size(count: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"
