"""Was the emulator, rather than the emulated fabric, the bottleneck?

PLATFORM.md measured that OVS's userspace datapath (one ovs-vswitchd
thread) forwards only a few hundred Mbit/s on this 2-core machine.  A run
whose datapath ran out of CPU measures the emulator, not the fabric, so every
run samples CPU use and checks its flows:

* :class:`CpuSampler` samples, in a background thread, the whole machine's
  CPU use from ``/proc/stat`` and the CPU use of named processes (by default
  ``ovs-vswitchd``) from ``/proc/<pid>/stat``.
* :func:`assess` turns that CPU summary and per-flow results into warnings: a
  flow that had its links to itself but fell short of its path's configured
  rate, or a saturated CPU, means the numbers should not be trusted.

Units: machine CPU is a percentage of *all* cores (100 % = every core busy);
a process's CPU is a percentage of *one* core (100 % = one core busy), the
natural unit for ovs-vswitchd's single forwarding thread.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

DEFAULT_PROCESS_NAMES = ("ovs-vswitchd",)

# The kernel truncates /proc/<pid>/comm to TASK_COMM_LEN - 1 characters.
_COMM_LENGTH = 15


@dataclass(frozen=True)
class CpuSnapshot:
    """Cumulative CPU counters read at one instant.

    ``machine_busy_s``/``machine_total_s`` are summed over all cores;
    ``process_cpu_s`` maps a label to {pid: user+system CPU seconds}.
    """

    wall_s: float
    machine_busy_s: float
    machine_total_s: float
    process_cpu_s: Mapping[str, Mapping[int, float]]


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


def _clock_ticks_per_second() -> int:
    return os.sysconf("SC_CLK_TCK")


def read_machine_cpu(proc_root: str = "/proc") -> Tuple[float, float, int]:
    """(busy seconds, total seconds, core count) of the whole machine so far.

    Busy is everything but idle and iowait.  guest/guest_nice are left out
    of the total because the kernel already counts them in user/nice.
    """
    ticks = _clock_ticks_per_second()
    cores = 0
    busy = total = None
    with open(os.path.join(proc_root, "stat")) as stat:
        for line in stat:
            if line.startswith("cpu "):
                fields = [int(value) for value in line.split()[1:9]]
                fields += [0] * (8 - len(fields))
                user, nice, system, idle, iowait, irq, softirq, steal = fields
                total = sum(fields)
                busy = total - idle - iowait
            elif line.startswith("cpu"):
                cores += 1
    if total is None:
        raise ValueError(f"{proc_root}/stat has no aggregate 'cpu' line")
    return busy / ticks, total / ticks, max(cores, 1)


def read_process_cpu_s(pid: int, proc_root: str = "/proc") -> float:
    """User + system CPU seconds used so far by process ``pid``.

    Raises FileNotFoundError/ProcessLookupError if the process is gone.
    """
    with open(os.path.join(proc_root, str(pid), "stat")) as stat:
        text = stat.read()
    # The command name (field 2) may itself hold spaces or ')': split after
    # the last ')' and count the remaining fields from field 3 (state).
    rest = text[text.rindex(")") + 2:].split()
    utime, stime = int(rest[11]), int(rest[12])
    return (utime + stime) / _clock_ticks_per_second()


def find_pids(name: str, proc_root: str = "/proc") -> List[int]:
    """Pids whose ``/proc/<pid>/comm`` is exactly ``name``.

    comm is at most 15 characters, so a longer name is compared by its first
    15.  Exact comparison avoids the ``pgrep -f``-style trap of matching the
    tcpdump or shell whose command line mentions the name.
    """
    wanted = name[:_COMM_LENGTH]
    pids = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, entry, "comm")) as comm:
                if comm.read().rstrip("\n") == wanted:
                    pids.append(int(entry))
        except OSError:
            continue  # the process exited while we looked
    return sorted(pids)


def cpu_sample(previous: CpuSnapshot, current: CpuSnapshot) -> CpuSample:
    """CPU use between two snapshots, in percent (see the module docstring).

    A process's use is summed over the pids present in both snapshots, so a
    process that restarted in between is not charged its whole lifetime.
    """
    duration_s = current.wall_s - previous.wall_s
    total_delta = current.machine_total_s - previous.machine_total_s
    machine_pct = None
    if total_delta > 0:
        busy_delta = current.machine_busy_s - previous.machine_busy_s
        machine_pct = min(max(100.0 * busy_delta / total_delta, 0.0), 100.0)
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
                     machine_pct=machine_pct, process_pct_of_core=process_pct)


def _stats(values: Iterable[Optional[float]]
           ) -> Tuple[Optional[float], Optional[float]]:
    present = [value for value in values if value is not None]
    if not present:
        return None, None
    return sum(present) / len(present), max(present)


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
    ``proc_root`` exists for tests.  The thread waits on a
    :class:`threading.Event`, so :meth:`stop` returns within one read of
    ``/proc``, not one interval.
    """

    def __init__(self, process_names: Sequence[str] = DEFAULT_PROCESS_NAMES,
                 interval_s: float = 0.5, *,
                 pids: Optional[Mapping[str, int]] = None,
                 proc_root: str = "/proc") -> None:
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
        self.proc_root = proc_root
        self.samples: List[CpuSample] = []
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
                result[label] = {pid: read_process_cpu_s(pid, self.proc_root)}
            except (FileNotFoundError, ProcessLookupError):
                result[label] = {}
        for name in self.process_names:
            by_pid = self._read_named(name, self._pids_by_name.get(name, []))
            if not by_pid:
                # None alive (not started yet, or restarted): look again.
                self._pids_by_name[name] = find_pids(name, self.proc_root)
                by_pid = self._read_named(name, self._pids_by_name[name])
            result[name] = by_pid
            self._seen_pids[name].update(by_pid)
        return result

    def _read_named(self, name: str, pids: Iterable[int]) -> Dict[int, float]:
        by_pid = {}
        for pid in pids:
            try:
                by_pid[pid] = read_process_cpu_s(pid, self.proc_root)
            except (FileNotFoundError, ProcessLookupError):
                continue
        return by_pid

    def snapshot(self) -> CpuSnapshot:
        """Read all counters now."""
        busy_s, total_s, self.cores = read_machine_cpu(self.proc_root)
        return CpuSnapshot(wall_s=time.monotonic(), machine_busy_s=busy_s,
                           machine_total_s=total_s,
                           process_cpu_s=self._process_cpu())

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
        self.samples.append(sample)
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
                self.sample_now()
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
        machine_mean, machine_max = _stats(s.machine_pct for s in self.samples)
        processes = {}
        for label in list(self.fixed_pids) + list(self.process_names):
            mean, peak = _stats(s.process_pct_of_core.get(label)
                                for s in self.samples)
            pids = ([self.fixed_pids[label]] if label in self.fixed_pids
                    else sorted(self._seen_pids.get(label, ())))
            processes[label] = {"mean_pct_of_core": mean,
                                "max_pct_of_core": peak,
                                "pids": pids,
                                "found": mean is not None}
        return {"machine_cpu_pct": {"mean": machine_mean, "max": machine_max},
                "cores": self.cores,
                "processes": processes,
                "samples": len(self.samples),
                "interval_s": self.interval_s}


# Assessment --------------------------------------------------------------------

_FLOW_KEYS = ("id", "start", "end", "goodput_mbps", "cap_mbps", "links")


def _check_flows(flows: Sequence[Mapping]) -> None:
    for index, flow in enumerate(flows):
        missing = [key for key in _FLOW_KEYS if key not in flow]
        if missing:
            raise ValueError(f"flow #{index} ({flow.get('id', '?')}) lacks "
                             f"key(s) {missing}; each flow needs {list(_FLOW_KEYS)}")
        if flow["end"] < flow["start"]:
            raise ValueError(f"flow {flow['id']}: end ({flow['end']}) is before "
                             f"start ({flow['start']})")


def _alone(flows: Sequence[Mapping]) -> List[bool]:
    """For each flow: did no other flow use one of its links while it ran?"""
    users = defaultdict(list)
    for index, flow in enumerate(flows):
        for link in set(flow["links"]):
            users[link].append(index)
    alone = []
    for index, flow in enumerate(flows):
        others = {other for link in set(flow["links"]) for other in users[link]
                  if other != index}
        # Strict inequalities: a flow that starts as another ends did not
        # share the link with it.
        overlapping = [other for other in others
                       if flows[other]["start"] < flow["end"]
                       and flows[other]["end"] > flow["start"]]
        alone.append(not overlapping)
    return alone


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.0f} %"


def _cpu_warnings(cpu_summary: Optional[Mapping], saturation_pct: float) -> List[str]:
    if not cpu_summary:
        return []
    warnings = []
    machine = cpu_summary.get("machine_cpu_pct") or {}
    mean, peak = machine.get("mean"), machine.get("max")
    cores = cpu_summary.get("cores")
    if (mean is not None and mean >= saturation_pct) or \
            (peak is not None and peak >= saturation_pct):
        warnings.append(
            f"datapath saturated: machine CPU reached {_pct(peak)} "
            f"(mean {_pct(mean)}) of all {cores} cores, at or above "
            f"{saturation_pct:.0f} %; rates may reflect the emulator, not the fabric")
    ovs = (cpu_summary.get("processes") or {}).get("ovs-vswitchd") or {}
    ovs_peak = ovs.get("max_pct_of_core")
    if ovs_peak is not None and ovs_peak >= saturation_pct:
        warnings.append(
            f"datapath saturated: ovs-vswitchd reached {_pct(ovs_peak)} of one "
            f"core (mean {_pct(ovs.get('mean_pct_of_core'))}), at or above "
            f"{saturation_pct:.0f} %; "
            f"its userspace datapath forwards on one thread, so rates may "
            f"reflect the emulator, not the fabric")
    return warnings


def assess(flows: Sequence[Mapping], cpu_summary: Optional[Mapping], *,
           saturation_pct: float = 90.0, goodput_floor: float = 0.9) -> dict:
    """Fidelity warnings for one run.

    ``flows``: dicts with ``id``, ``start`` and ``end`` (epoch s),
    ``goodput_mbps``, ``cap_mbps`` (the configured bottleneck rate of the
    flow's path, emulated Mbit/s, or None) and ``links`` (ids of the links
    its path used).  A flow is *alone* if no other flow used any of its
    links during an overlapping time.  An alone flow with a cap should reach
    nearly all of it: TCP goodput over 1500-byte frames is about 95 % of the
    line rate, so the default floor is 90 %.  Falling short means the
    emulator (CPU, datapath) limited it, and gives a warning.

    ``cpu_summary`` is :meth:`CpuSampler.stop`'s result or None.  Machine
    CPU mean or max, or ovs-vswitchd's max (percent of one core), at or
    above ``saturation_pct`` marks the run saturated.

    Returns ``{"cpu", "flows_checked", "alone_flows", "warnings",
    "saturated", "thresholds"}``; ``flows_checked`` counts the flows given,
    ``alone_flows`` has one row per alone flow with a cap and a goodput.
    """
    if not 0 < goodput_floor <= 1:
        raise ValueError(f"goodput_floor must be in (0, 1], got {goodput_floor!r}")
    if not 0 < saturation_pct <= 100:
        raise ValueError(f"saturation_pct must be in (0, 100], got {saturation_pct!r}")
    _check_flows(flows)
    warnings = []
    rows = []
    for flow, alone in zip(flows, _alone(flows)):
        cap, goodput = flow["cap_mbps"], flow["goodput_mbps"]
        if not alone or cap is None or cap <= 0 or goodput is None:
            continue
        ratio = goodput / cap
        ok = ratio >= goodput_floor
        rows.append({"id": flow["id"], "goodput_mbps": goodput,
                     "cap_mbps": cap, "ratio": ratio, "ok": ok})
        if not ok:
            warnings.append(
                f"flow {flow['id']} had its links to itself but reached "
                f"{goodput:.1f} Mbit/s of its {cap:.1f} Mbit/s cap "
                f"(ratio {ratio:.2f} < {goodput_floor:.2f}): the emulator, "
                f"not the fabric, limited it")
    cpu_warnings = _cpu_warnings(cpu_summary, saturation_pct)
    return {"cpu": cpu_summary,
            "flows_checked": len(flows),
            "alone_flows": rows,
            "warnings": cpu_warnings + warnings,
            "saturated": bool(cpu_warnings),
            "thresholds": {"saturation_pct": saturation_pct,
                           "goodput_floor": goodput_floor}}
