"""Testbeds that an experiment opens itself, one after another (``OWNS_TESTBEDS``).

An experiment that compares fabrics needs one network per fabric, and Mininet
is global state: only one `emu.testbed.Testbed` may exist at a time.  Such an
experiment sets ``OWNS_TESTBEDS = True``; ``emu.run`` then does not wrap it in
a Testbed but hands it a `SeriesContext` whose ``testbeds`` opens them::

    for label, fabric in fabrics:
        with ctx.testbeds.open(label, fabric, scale) as bed:
            ...                                   # as ctx.bed in other kinds
            ctx.testbeds.record_flows(flows)

What the runner does around its single testbed is done here per testbed:
each one takes the run lock when it is entered (the first is refused at once
if another emulation holds it, exit code 3; a later one waits up to
``lock_wait_s``, since the run gave the lock up between fabrics), samples CPU
while the experiment holds it, dumps the flow and group tables at teardown
and checks the controller.  Each testbed writes ``controller.log`` and
``dumps/`` into its own subfolder of the run (``<run>/<label>/``).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from emu import results
from emu.experiments.base import Context, fidelity_rows
from emu.fidelity import CpuSampler
from emu.state import AlreadyRunning

LOCK_POLL_S = 5.0


@dataclass
class SeriesContext(Context):
    testbeds: Optional["TestbedSeries"] = None


class TestbedSeries:
    """Opens testbeds one at a time and keeps what ``result.json`` needs of them."""

    __test__ = False

    def __init__(self, run_dir: Path, description: str, log: Callable[[str], None] = print):
        self.run_dir = Path(run_dir)
        self.description = description
        self.log = log
        self.info: Dict = {}                 # datapath, netem, versions (from the first)
        self.build_s: Dict[str, float] = {}
        self.cpu: Dict[str, dict] = {}       # label -> CpuSampler summary
        self.warnings: List[str] = []
        self.fidelity_rows: List[dict] = []
        self._current = None

    def _enter(self, make, lock_wait_s: float):
        deadline = time.monotonic() + lock_wait_s
        while True:
            bed = make()
            try:
                return bed.__enter__()
            except AlreadyRunning:
                if not self.build_s or time.monotonic() >= deadline:
                    raise
                self.log(f"  another emulation took the lock between fabrics; waiting up to "
                         f"{max(0.0, deadline - time.monotonic()):.0f} s")
                time.sleep(LOCK_POLL_S)   # polling the lock: trying to take it is the check

    @contextmanager
    def open(self, label: str, fabric, scale, lock_wait_s: float = 0.0) -> Iterator:
        """A Testbed for ``fabric`` in ``<run>/<label>/``; closed on leaving the block."""
        from emu.testbed import Testbed

        if self._current is not None:
            raise RuntimeError(f"testbed {self._current!r} is still open: one at a time")
        folder = self.run_dir / label
        bed = self._enter(lambda: Testbed(fabric, scale, folder, log=self.log,
                                          description=f"{self.description} ({label})"),
                          lock_wait_s)
        self._current = label
        sampler = None
        try:
            if not self.info:
                self.info = {"datapath": bed.datapath.info.datapath, "netem": bed.datapath.netem,
                             "versions": results.versions(bed.datapath.info.version)}
            self.build_s[label] = round(bed.build_s, 3)
            self.warnings += [f"{label}: {w}" for w in bed.warnings]
            self._fabric, self._scale = fabric, scale
            sampler = CpuSampler(("ovs-vswitchd",), interval_s=0.5).start()
            try:
                yield bed
            finally:
                self.cpu[label] = sampler.stop()
                results.dump_switches(folder, [s.name for s in bed.net.switches])
            bed.check_controller()
            if "Traceback" in bed.controller_log():
                self.warnings.append(f"{label}: the controller log holds a traceback: "
                                     f"see {label}/controller.log")
        finally:
            self._current = None
            bed.__exit__(*sys.exc_info())

    def record_flows(self, flows) -> None:
        """Flows of the open testbed, for the run's fidelity check."""
        if self._current is None:
            raise RuntimeError("record_flows() outside open()")
        for row in fidelity_rows(self._fabric, self._scale, flows):
            row["links"] = [f"{self._current}:{link}" for link in row["links"]]
            self.fidelity_rows.append(row)

    def cpu_summary(self) -> Optional[dict]:
        """The testbeds' CPU samples as one `CpuSampler` summary: means weighted
        by sample count, maxima over all."""
        return combine_cpu(list(self.cpu.values()))

    def result_fields(self) -> dict:
        fields = dict(self.info)
        fields["build_s"] = dict(self.build_s)
        fields["cpu_by_testbed"] = dict(self.cpu)
        return fields


def _weighted(pairs) -> Optional[float]:
    pairs = [(v, n) for v, n in pairs if v is not None and n]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None


def _peak(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def combine_cpu(summaries: List[dict]) -> Optional[dict]:
    if not summaries:
        return None
    if len(summaries) == 1:
        return summaries[0]
    machine = [(s["machine_cpu_pct"], s["samples"]) for s in summaries]
    names = list(dict.fromkeys(n for s in summaries for n in s["processes"]))
    processes = {}
    for name in names:
        rows = [(s["processes"].get(name), s["samples"]) for s in summaries]
        rows = [(p, n) for p, n in rows if p is not None]
        mean = _weighted((p["mean_pct_of_core"], n) for p, n in rows)
        processes[name] = {"mean_pct_of_core": mean,
                           "max_pct_of_core": _peak(p["max_pct_of_core"] for p, _ in rows),
                           "pids": sorted({pid for p, _ in rows for pid in p["pids"]}),
                           "found": mean is not None}
    return {"machine_cpu_pct": {"mean": _weighted((m["mean"], n) for m, n in machine),
                                "max": _peak(m["max"] for m, _ in machine)},
            "cores": summaries[0]["cores"], "processes": processes,
            "samples": sum(s["samples"] for s in summaries),
            "interval_s": summaries[0]["interval_s"]}
