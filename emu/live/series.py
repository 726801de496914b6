"""Every testbed of a run, opened one at a time, sampled, dumped and checked the same way.

Mininet is global state: only one `emu.live.testbed.Testbed` may exist at a
time.  A run opens its testbeds through one `TestbedSeries`: the runner opens
the scenario's one testbed itself (``Network.ONE``), and an experiment that
compares fabrics opens one per fabric (``Network.SERIES``)::

    for label, fabric in fabrics:
        with ctx.testbeds.open(label, fabric, scale) as bed:
            ...
            ctx.testbeds.record_flows(flows)

Around each testbed the series does what a run needs of it: it takes the run
lock when the testbed is entered (the first is refused at once if another
emulation holds it, exit code 3; a later one waits up to ``lock_wait_s``,
since the run gave the lock up between fabrics), samples CPU while the
experiment holds it (`emu.live.cpu`), dumps the switch tables at teardown,
checks the controller, reads its log for tracebacks and warns of the OpenFlow
connections it refused or saw taken over.  A labelled testbed
writes ``controller.log`` and ``dumps/`` into ``<run>/<label>/``; the
unlabelled one into the run folder itself.  The flows recorded per testbed
feed the run's fidelity check (`emu.fidelity`).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from emu.live import drops
from emu.live.cpu import CpuSampler, combine_cpu
from emu.live.feed import RunFeed
from emu.live.state import AlreadyRunning

LOCK_POLL_S = 5.0


@dataclass
class Recorded:
    """Flows measured on one testbed, with what is needed to check them."""

    label: Optional[str]
    fabric: object
    scale: object
    flows: list
    # By position in ``flows``: one testbed may replay the same flow ids more
    # than once (pd-pairing's configurations, pd-failure's repeats).
    paths: Dict[int, List[str]] = field(default_factory=dict)   # flow index -> nodes
    ports: Dict[int, List[int]] = field(default_factory=dict)   # flow index -> out ports


def controller_warnings(status: dict) -> List[str]:
    """What the controller's status says of connections it did not expect: a
    datapath it refused (no switch of the fabric has its dpid), a switch whose
    connection another took over.  Either means something else spoke OpenFlow
    to this run's controller, so the run's result says so."""
    warnings = [f"the controller refused {r['times']} OpenFlow connection(s) from "
                f"{r['peer']} for dpid {r['dpid']}, which no switch of the fabric has"
                for r in status.get("refused") or []]
    warnings += [f"switch {t['switch']}: a second OpenFlow connection ({t['new_peer']}) "
                 f"took over from {t['old_peer']} ({t['times']} time(s)); the old one was "
                 "closed" for t in status.get("takeovers") or []]
    return warnings


def _status(bed) -> dict:
    from emu.live.testbed import TestbedError

    try:
        return bed.status()
    except TestbedError:        # a dead controller was reported by check_controller
        return {}


class TestbedSeries:
    """Opens testbeds one at a time and keeps what ``result.json`` needs of them."""

    __test__ = False

    def __init__(self, run_dir: Path, description: str, log: Callable[[str], None] = print,
                 dataplane: str = "auto", congestion: str = "cubic", ecmp_seed: int = 1,
                 panel: str = "auto", feed: Optional[RunFeed] = None, cpu_alarm_pct: Optional[float] = None,
                 servers=(), ssh_config: str = ""):
        self.run_dir = Path(run_dir)
        self.servers = list(servers or [])
        self.ssh_config = ssh_config
        self.cluster: Dict[Optional[str], dict] = {}   # label -> Testbed.cluster_record
        self.feed = feed if feed is not None else RunFeed()
        # The fidelity check judges CPU at the run's end; a watcher is told at
        # once when a sample reaches the same threshold.
        self.cpu_alarm_pct = cpu_alarm_pct
        self._alarmed = False
        self.dataplane = dataplane
        self.congestion = congestion
        self.panel = panel
        self.ecmp_seed = ecmp_seed
        self.description = description
        self.log = log
        self.info: Dict = {}                 # datapath, netem, versions (from the first)
        self.build_s: Dict[Optional[str], float] = {}
        # Each time a testbed's controller died and a successor took over
        # (`emu.live.keeper`), by label.
        self.outages: Dict[Optional[str], List[dict]] = {}
        self.cpu: Dict[Optional[str], dict] = {}     # label -> CpuSampler summary
        self.drops: Dict[Optional[str], dict] = {}   # label -> emu.live.drops counts
        self.warnings: List[str] = []
        self.recorded: List[Recorded] = []
        self._current: Optional[Recorded] = None

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
    def open(self, label: Optional[str], fabric, scale, lock_wait_s: float = 0.0) -> Iterator:
        """A Testbed for ``fabric`` in ``<run>/<label>/`` (the run folder when the
        label is None); closed on leaving the block."""
        from emu.live.testbed import Testbed

        if self._current is not None:
            raise RuntimeError(f"testbed {self._current.label!r} is still open: one at a time")
        folder = self.run_dir if label is None else self.run_dir / label
        tag = "" if label is None else f"{label}: "
        description = self.description if label is None else f"{self.description} ({label})"
        self.feed.label = label    # every event of this testbed says which it is
        try:
            bed = self._enter(lambda: Testbed(fabric, scale, folder, log=self.log,
                                              description=description, dataplane=self.dataplane,
                                              congestion=self.congestion, panel=self.panel,
                                              ecmp_seed=self.ecmp_seed, feed=self.feed,
                                              servers=self.servers,
                                              ssh_config=self.ssh_config),
                              lock_wait_s)
        except BaseException:
            self.feed.label = None
            raise
        self._current = Recorded(label, fabric, scale, [])
        self._bed = bed
        try:
            if not self.info:
                self.info = bed.describe()
            self.build_s[label] = round(bed.build_s, 3)
            self.warnings += [tag + w for w in bed.warnings]
            for warning in bed.warnings:
                self.feed.emit("warning", text=tag + warning)
            before = bed.drop_counters(log_since=drops.log_size())
            self._alarmed = False
            sampler = CpuSampler(bed.dataplane.processes, interval_s=0.5,
                                 on_sample=self._cpu_sampled).start()
            try:
                yield bed
            finally:
                self.cpu[label] = sampler.stop()
                self.drops[label] = drops.delta(
                    before, bed.drop_counters(log_since=before.vswitchd_log_bytes)).to_dict()
                bed.dump_tables(folder / "dumps")
                if self.servers:
                    self.cluster[label] = bed.finish_cluster()
            bed.check_controller()
            self._record_outages(label, tag, bed)
            self.warnings += [tag + w for w in controller_warnings(_status(bed))]
            if "Traceback" in bed.controller_log():
                log = "controller.log" if label is None else f"{label}/controller.log"
                self.warnings.append(f"{tag}the controller log holds a traceback: see {log}")
        finally:
            if self._current.flows:
                self.recorded.append(self._current)
            self._current = None
            bed.__exit__(*sys.exc_info())
            if self.servers:
                # The files gathered from the servers are known once it closed.
                self.cluster[label] = dict(bed.cluster_record)
            self.feed.label = None

    def _record_outages(self, label: Optional[str], tag: str, bed) -> None:
        outages = list(bed.keeper.outages) if bed.keeper is not None else []
        if not outages:
            return
        self.outages[label] = outages
        worst = max(o.get("outage_s", 0.0) for o in outages)
        self.warnings.append(f"{tag}the controller died {len(outages)} time(s) during the "
                             f"run; a successor took over each time (longest outage "
                             f"{worst:.1f} s: see controller_outages)")

    def _cpu_sampled(self, sample) -> None:
        self.feed.emit("cpu", machine_pct=sample.machine_pct, softirq_pct=sample.softirq_pct,
                       processes=dict(sample.process_pct_of_core))
        if self.cpu_alarm_pct is not None and not self._alarmed and \
                (sample.machine_pct or 0.0) >= self.cpu_alarm_pct:
            self._alarmed = True
            self.feed.emit("warning", text=f"machine CPU at {sample.machine_pct:.0f} % just "
                                           f"now (the saturation threshold is "
                                           f"{self.cpu_alarm_pct:.0f} %); the run's fidelity "
                                           "check at its end says whether it mattered")

    def record_flows(self, flows) -> None:
        """Flows of the open testbed, for the run's fidelity check, with the path
        the data plane gives each of them now (as of the end of the flows: one
        that crossed a reconfiguration or a failure is shown on its last path)."""
        if self._current is None:
            raise RuntimeError("record_flows() outside open()")
        flows = list(flows)
        first = len(self._current.flows)
        self._current.flows.extend(flows)
        paths, ports = self._bed.flow_paths(flows)
        for index, (path, out_ports) in enumerate(zip(paths, ports), start=first):
            if path:
                self._current.paths[index] = path
            if out_ports:
                self._current.ports[index] = out_ports

    def cpu_summary(self) -> Optional[dict]:
        """The testbeds' CPU samples as one `CpuSampler` summary: means weighted
        by sample count, maxima over all."""
        return combine_cpu(list(self.cpu.values()))

    def servers_cpu(self) -> Optional[Dict[str, Optional[float]]]:
        """Cluster mode: each server's CPU over the run (the busiest of its
        testbeds), in percent of all its cores."""
        found: Dict[str, Optional[float]] = {}
        for record in self.cluster.values():
            for server in record.get("servers", []):
                pct, before = server.get("cpu_pct"), found.get(server["name"])
                found[server["name"]] = pct if before is None else \
                    (before if pct is None else max(pct, before))
        return found or None

    def drops_summary(self) -> Optional[dict]:
        """The testbeds' drop counts (`emu.live.drops`), summed."""
        if not self.drops:
            return None
        keys = next(iter(self.drops.values())).keys()
        return {key: sum(counts[key] for counts in self.drops.values()) for key in keys}

    def result_fields(self) -> dict:
        """What ``result.json`` records of the testbeds: data plane, versions, build
        times (one number for the run's single testbed, else per label), and the
        CPU and drop counts of each labelled testbed."""
        fields = dict(self.info)
        fields["controller_outages"] = self.outages.get(None, []) \
            if set(self.outages) <= {None} else dict(self.outages)
        if self.cluster:
            fields["cluster"] = self.cluster[None] if list(self.cluster) == [None] \
                else dict(self.cluster)
        if list(self.build_s) == [None]:
            fields["build_s"] = self.build_s[None]
        elif self.build_s:
            fields["build_s"] = dict(self.build_s)
            fields["cpu_by_testbed"] = dict(self.cpu)
            fields["drops_by_testbed"] = dict(self.drops)
        return fields
