"""CPU use of the machine and of named processes while a testbed runs.

A run whose data plane ran out of CPU measures the emulator, not the fabric
(Open vSwitch's userspace datapath forwards on one thread), so every testbed
is sampled while the experiment holds it, and `emu.fidelity.assess` turns
the summary into warnings.

:class:`CpuSampler` samples, in a background thread, the whole machine's CPU
use and the CPU use of named processes (by default ``ovs-vswitchd``), read
with psutil (`PsutilReader`).  :func:`combine_cpu` merges the summaries of
several testbeds into one.

Units: machine CPU is a percentage of *all* cores (100 % = every core busy);
a process's CPU is a percentage of *one* core (100 % = one core busy), the
natural unit for ovs-vswitchd's single forwarding thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import psutil

LOG = logging.getLogger("emu.cpu")

DEFAULT_PROCESS_NAMES = ("ovs-vswitchd",)

# psutil's CPU time fields that make up the total (guest is inside user).
_MACHINE_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class CpuSnapshot:
    """Cumulative CPU counters read at one instant.

    ``machine_busy_s``/``machine_total_s``/``machine_softirq_s`` are summed
    over all cores (softirq is where the kernel forwards packets);
    ``process_cpu_s`` maps a label to {pid: user+system CPU seconds}.
    """

    wall_s: float
    machine_busy_s: float
    machine_total_s: float
    process_cpu_s: Mapping[str, Mapping[int, float]]
    machine_softirq_s: float = 0.0


@dataclass(frozen=True)
class CpuSample:
    """CPU use over the interval between two snapshots.

    ``process_pct_of_core`` is None for a label with no live process in
    both snapshots.
    """

    t: float
    duration_s: float
    machine_pct: Optional[float]
    process_pct_of_core: Mapping[str, Optional[float]]
    softirq_pct: Optional[float] = None      # of all cores, like machine_pct


class PsutilReader:
    """Cumulative CPU counters from psutil: the machine's and one process's."""

    def machine(self) -> Tuple[float, float, int, float]:
        """(busy seconds, total seconds, core count, softirq seconds) of the whole
        machine so far.

        Busy is everything but idle and iowait; guest time is already inside
        user time, so it is not counted twice.
        """
        times = psutil.cpu_times()
        total = sum(getattr(times, name) for name in _MACHINE_FIELDS if hasattr(times, name))
        busy = total - times.idle - getattr(times, "iowait", 0.0)
        return busy, total, psutil.cpu_count() or 1, getattr(times, "softirq", 0.0)

    def process_cpu_s(self, pid: int) -> float:
        """User + system CPU seconds used so far by ``pid``; ProcessLookupError once gone."""
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            raise ProcessLookupError(pid) from None
        return times.user + times.system

    def find_pids(self, name: str) -> List[int]:
        """Pids whose process name is exactly ``name`` (not a command line that
        mentions it, as ``pgrep -f`` would match a tcpdump or a shell)."""
        return sorted(proc.pid for proc in psutil.process_iter(["name"])
                      if proc.info["name"] == name)


def cpu_sample(previous: CpuSnapshot, current: CpuSnapshot) -> CpuSample:
    """CPU use between two snapshots, in percent (see the module docstring).

    A process's use is summed over the pids present in both snapshots, so a
    process that restarted in between is not charged its whole lifetime.
    """
    duration_s = current.wall_s - previous.wall_s
    total_delta = current.machine_total_s - previous.machine_total_s
    machine_pct = softirq_pct = None
    if total_delta > 0:
        busy_delta = current.machine_busy_s - previous.machine_busy_s
        machine_pct = min(max(100.0 * busy_delta / total_delta, 0.0), 100.0)
        softirq_delta = current.machine_softirq_s - previous.machine_softirq_s
        softirq_pct = min(max(100.0 * softirq_delta / total_delta, 0.0), 100.0)
    process_pct: Dict[str, Optional[float]] = {}
    for label, now_by_pid in current.process_cpu_s.items():
        before_by_pid = previous.process_cpu_s.get(label, {})
        common = set(now_by_pid) & set(before_by_pid)
        if not common or duration_s <= 0:
            process_pct[label] = None
            continue
        used_s = sum(now_by_pid[pid] - before_by_pid[pid] for pid in common)
        process_pct[label] = max(100.0 * used_s / duration_s, 0.0)
    return CpuSample(t=current.wall_s, duration_s=duration_s,
                     machine_pct=machine_pct, process_pct_of_core=process_pct,
                     softirq_pct=softirq_pct)


# Samples a sampler keeps as they are (for watchers and tests): its summary is
# folded as it goes, so a run of hours at two samples a second holds a minute
# of them, not every one.
KEPT_SAMPLES = 120


class _Running:
    """Mean and max of the values given so far (None values skipped)."""

    __slots__ = ("count", "total", "peak")

    def __init__(self) -> None:
        self.count, self.total, self.peak = 0, 0.0, None

    def add(self, value: Optional[float]) -> None:
        if value is None:
            return
        self.count += 1
        self.total += value
        self.peak = value if self.peak is None else max(self.peak, value)

    def stats(self) -> Tuple[Optional[float], Optional[float]]:
        return (self.total / self.count, self.peak) if self.count else (None, None)


class CpuSampler:
    """Sample machine and per-process CPU use in a background thread.

    ::

        with CpuSampler(("ovs-vswitchd",), interval_s=0.5) as sampler:
            run_the_traffic()
        summary = sampler.summary()

    or ``sampler.start()`` ... ``summary = sampler.stop()``.

    Processes are found by exact ``comm`` name (``process_names``) and/or
    given as ``pids`` ({label: pid}).  The CPU of all processes sharing a name
    is summed.  A name with no live process is looked up again at the next
    sample, so a datapath that starts after the sampler is still caught.
    ``reader`` (a `PsutilReader` by default) exists for tests.  The thread waits on a
    :class:`threading.Event`, so :meth:`stop` returns within one read of
    ``/proc``, not one interval.
    """

    def __init__(self, process_names: Sequence[str] = DEFAULT_PROCESS_NAMES,
                 interval_s: float = 0.5, *,
                 pids: Optional[Mapping[str, int]] = None,
                 reader: Optional[PsutilReader] = None,
                 on_sample: Optional[Callable[[CpuSample], None]] = None) -> None:
        if isinstance(process_names, str):
            raise ValueError("process_names must be a sequence of names, "
                             f"not the single string {process_names!r}")
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) \
                or not math.isfinite(interval_s) or interval_s <= 0:
            raise ValueError(f"interval_s must be a positive finite number of "
                             f"seconds, got {interval_s!r}")
        self.process_names = tuple(process_names)
        self.fixed_pids = dict(pids or {})
        overlap = set(self.process_names) & set(self.fixed_pids)
        if overlap:
            raise ValueError(f"labels {sorted(overlap)} appear both in "
                             f"process_names and pids; use one")
        self.interval_s = float(interval_s)
        self.reader = reader or PsutilReader()
        # Told each sample as it is taken (the run's live view); never the run's fate.
        self.on_sample = on_sample
        self.samples: List[CpuSample] = []          # the last KEPT_SAMPLES of them
        self._count = 0
        self._machine, self._softirq = _Running(), _Running()
        self._processes: Dict[str, _Running] = defaultdict(_Running)
        self.cores: Optional[int] = None
        self._pids_by_name: Dict[str, List[int]] = {}
        self._seen_pids: Dict[str, set] = defaultdict(set)
        self._stop_event = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._previous: Optional[CpuSnapshot] = None
        self._error: Optional[BaseException] = None
        self._summary: Optional[dict] = None

    # Reading -----------------------------------------------------------------
    def _process_cpu(self) -> Dict[str, Dict[int, float]]:
        result: Dict[str, Dict[int, float]] = {}
        for label, pid in self.fixed_pids.items():
            try:
                result[label] = {pid: self.reader.process_cpu_s(pid)}
            except ProcessLookupError:
                result[label] = {}
        for name in self.process_names:
            by_pid = self._read_named(name, self._pids_by_name.get(name, []))
            if not by_pid:
                # None alive (not started yet, or restarted): look again.
                self._pids_by_name[name] = self.reader.find_pids(name)
                by_pid = self._read_named(name, self._pids_by_name[name])
            result[name] = by_pid
            self._seen_pids[name].update(by_pid)
        return result

    def _read_named(self, name: str, pids: Iterable[int]) -> Dict[int, float]:
        by_pid = {}
        for pid in pids:
            try:
                by_pid[pid] = self.reader.process_cpu_s(pid)
            except ProcessLookupError:
                continue
        return by_pid

    def snapshot(self) -> CpuSnapshot:
        """Read all counters now."""
        busy_s, total_s, self.cores, softirq_s = self.reader.machine()
        return CpuSnapshot(wall_s=time.monotonic(), machine_busy_s=busy_s,
                           machine_total_s=total_s, process_cpu_s=self._process_cpu(),
                           machine_softirq_s=softirq_s)

    def take_baseline(self) -> None:
        """Read the counters that the next sample is measured from.

        :meth:`start` calls it; call it directly only to drive sampling by
        hand with :meth:`sample_now` (no thread), as the tests do.
        """
        self._previous = self.snapshot()

    def sample_now(self) -> CpuSample:
        """Take a snapshot and record the sample since the previous one."""
        current = self.snapshot()
        if self._previous is None:
            raise RuntimeError("sample_now() before start() or take_baseline()")
        sample = cpu_sample(self._previous, current)
        self._previous = current
        self._count += 1
        self._machine.add(sample.machine_pct)
        self._softirq.add(sample.softirq_pct)
        for label, pct in sample.process_pct_of_core.items():
            self._processes[label].add(pct)
        self.samples.append(sample)
        del self.samples[:-KEPT_SAMPLES]
        return sample

    # Lifecycle ---------------------------------------------------------------
    def start(self) -> "CpuSampler":
        if self._thread is not None:
            raise RuntimeError("CpuSampler already started; use a new one")
        self.take_baseline()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop_event.wait(self.interval_s):
                sample = self.sample_now()
                if self.on_sample is not None:
                    try:
                        self.on_sample(sample)
                    except Exception:  # a watcher's bug must not stop the sampling
                        LOG.exception("CPU on_sample failed; no more samples are handed to it")
                        self.on_sample = None
        except BaseException as error:  # re-raised by stop(): fail loudly
            self._error = error

    def stop(self) -> dict:
        """Stop sampling and return :meth:`summary`; calling it again is harmless."""
        if self._thread is None:
            raise RuntimeError("CpuSampler.stop() before start()")
        if self._summary is not None:
            return self._summary
        self._stop_event.set()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"CPU sampling failed: {self._error!r}") \
                from self._error
        # Keep the tail of the run unless it is too short to mean anything.
        if time.monotonic() - self._previous.wall_s >= self.interval_s / 2:
            self.sample_now()
        self._summary = self.summary()
        return self._summary

    def __enter__(self) -> "CpuSampler":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # Results -----------------------------------------------------------------
    def summary(self) -> dict:
        """Mean and max of the samples so far (None where nothing was measured)."""
        machine_mean, machine_max = self._machine.stats()
        softirq_mean, softirq_max = self._softirq.stats()
        processes = {}
        for label in list(self.fixed_pids) + list(self.process_names):
            mean, peak = self._processes[label].stats() if label in self._processes \
                else (None, None)
            pids = ([self.fixed_pids[label]] if label in self.fixed_pids
                    else sorted(self._seen_pids.get(label, ())))
            processes[label] = {"mean_pct_of_core": mean,
                                "max_pct_of_core": peak,
                                "pids": pids,
                                "found": mean is not None}
        return {"machine_cpu_pct": {"mean": machine_mean, "max": machine_max},
                "softirq_pct": {"mean": softirq_mean, "max": softirq_max},
                "cores": self.cores,
                "processes": processes,
                "samples": self._count,
                "interval_s": self.interval_s}


# Several testbeds ----------------------------------------------------------

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
    softirq = [(s.get("softirq_pct") or {}, s["samples"]) for s in summaries]
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
            "softirq_pct": {"mean": _weighted((m.get("mean"), n) for m, n in softirq),
                            "max": _peak(m.get("max") for m, _ in softirq)},
            "cores": summaries[0]["cores"], "processes": processes,
            "samples": sum(s["samples"] for s in summaries),
            "interval_s": summaries[0]["interval_s"]}
