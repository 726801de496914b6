"""Tests for emu.live.cpu: CPU sampling with psutil, and summaries of several testbeds."""

import os
import subprocess
import sys
import time
import uuid

import pytest

import psutil

from emu.live.cpu import CpuSampler, CpuSnapshot, PsutilReader, cpu_sample


class FakeReader:
    """Counters set by the test: machine (busy s, total s, cores) and {pid: (name, cpu s)}."""

    def __init__(self, busy_s=0.0, total_s=0.0, cores=2, processes=None, softirq_s=0.0):
        self.set(busy_s, total_s, processes or {}, softirq_s)
        self.cores = cores

    def set(self, busy_s, total_s, processes, softirq_s=0.0):
        self.busy_s, self.total_s, self.processes = busy_s, total_s, dict(processes)
        self.softirq_s = softirq_s

    def machine(self):
        return self.busy_s, self.total_s, self.cores, self.softirq_s

    def process_cpu_s(self, pid):
        if pid not in self.processes:
            raise ProcessLookupError(pid)
        return self.processes[pid][1]

    def find_pids(self, name):
        return sorted(pid for pid, (comm, _) in self.processes.items() if comm == name)


def busy_for(seconds):
    deadline = time.monotonic() + seconds
    count = 0
    while time.monotonic() < deadline:
        count += 1
    return count


def test_psutil_reader_agrees_with_the_machine_and_this_process():
    reader = PsutilReader()
    busy_s, total_s, cores, softirq_s = reader.machine()
    assert 0 < busy_s < total_s and cores == psutil.cpu_count()
    assert 0 <= softirq_s < busy_s
    mine = psutil.Process().cpu_times()
    assert reader.process_cpu_s(os.getpid()) >= mine.user + mine.system - 0.05
    assert os.getpid() in reader.find_pids(psutil.Process().name())
    assert reader.find_pids("no-such-process-x") == []
    with pytest.raises(ProcessLookupError):
        reader.process_cpu_s(2 ** 22 + 1)            # above pid_max: never alive


def test_cpu_sample_percentages():
    before = CpuSnapshot(wall_s=10.0, machine_busy_s=5.0, machine_total_s=20.0,
                         process_cpu_s={"ovs-vswitchd": {42: 1.0, 43: 2.0},
                                        "gone": {7: 1.0}})
    after = CpuSnapshot(wall_s=12.0, machine_busy_s=8.0, machine_total_s=24.0,
                        process_cpu_s={"ovs-vswitchd": {42: 2.5, 44: 9.0},
                                       "gone": {}})
    sample = cpu_sample(before, after)
    assert sample.duration_s == 2.0
    assert sample.machine_pct == pytest.approx(75.0)      # 3 of 4 core-seconds
    # Only pid 42 lived through both snapshots: 1.5 s of CPU in 2 s.
    assert sample.process_pct_of_core["ovs-vswitchd"] == pytest.approx(75.0)
    assert sample.process_pct_of_core["gone"] is None


def test_sampler_finds_a_process_that_starts_late():
    reader = FakeReader(busy_s=0.0, total_s=10.0)
    sampler = CpuSampler(("ovs-vswitchd",), interval_s=60, reader=reader)
    sampler.take_baseline()                 # sampled by hand, no thread
    reader.set(5.0, 20.0, {42: ("ovs-vswitchd", 0.0)}, softirq_s=2.5)
    first = sampler.sample_now()
    assert first.machine_pct == pytest.approx(50.0)
    assert first.softirq_pct == pytest.approx(25.0), "softirq: a share of all cores, too"
    assert first.process_pct_of_core["ovs-vswitchd"] is None   # just appeared
    reader.set(5.0, 20.0, {42: ("ovs-vswitchd", 1.0)}, softirq_s=2.5)
    second = sampler.sample_now()
    assert second.machine_pct is None       # no CPU time elapsed: undefined
    assert second.process_pct_of_core["ovs-vswitchd"] > 0
    summary = sampler.summary()
    assert summary["samples"] == 2 and summary["cores"] == 2
    assert summary["machine_cpu_pct"] == {"mean": 50.0, "max": 50.0}
    assert summary["softirq_pct"] == {"mean": 25.0, "max": 25.0}
    assert summary["processes"]["ovs-vswitchd"]["pids"] == [42]
    assert summary["processes"]["ovs-vswitchd"]["found"]


def test_a_long_run_keeps_its_summary_not_every_sample(monkeypatch):
    """Two samples a second for hours: the summary is folded as samples come,
    and only the last KEPT_SAMPLES are held (a run must not grow with its time)."""
    from emu.live import cpu
    monkeypatch.setattr(cpu, "KEPT_SAMPLES", 10)
    reader = FakeReader(busy_s=0.0, total_s=10.0, processes={42: ("ovs-vswitchd", 0.0)})
    sampler = CpuSampler(("ovs-vswitchd",), interval_s=60, reader=reader)
    sampler.take_baseline()
    busy = total = proc = 0.0
    for step in range(1, 51):
        busy, total, proc = busy + step, total + 100.0, proc + step / 50    # climbing load
        reader.set(busy, 10.0 + total, {42: ("ovs-vswitchd", proc)})
        sampler.sample_now()
    assert len(sampler.samples) == 10
    assert sampler.samples[-1].machine_pct == pytest.approx(50.0)
    summary = sampler.summary()
    assert summary["samples"] == 50
    assert summary["machine_cpu_pct"]["mean"] == pytest.approx(25.5)       # mean of 1..50 %
    assert summary["machine_cpu_pct"]["max"] == pytest.approx(50.0)
    assert summary["processes"]["ovs-vswitchd"]["found"]
    assert summary["processes"]["ovs-vswitchd"]["max_pct_of_core"] > 0


def test_sampler_charges_a_restarted_process_only_its_new_life():
    reader = FakeReader(busy_s=0.0, total_s=10.0, processes={42: ("ovs-vswitchd", 5.0)})
    sampler = CpuSampler(("ovs-vswitchd",), interval_s=60, reader=reader)
    sampler.take_baseline()
    reader.set(1.0, 20.0, {43: ("ovs-vswitchd", 100.0)})      # 42 exited, 43 started
    assert sampler.sample_now().process_pct_of_core["ovs-vswitchd"] is None


def test_sampler_measures_this_process_by_pid():
    with CpuSampler(process_names=(), interval_s=0.05,
                    pids={"pytest": os.getpid()}) as sampler:
        busy_for(0.4)
    summary = sampler.summary()
    assert summary["samples"] >= 4
    assert summary["interval_s"] == 0.05
    assert summary["cores"] == os.cpu_count()
    me = summary["processes"]["pytest"]
    # A busy loop holds one core; leave room for a loaded test machine.
    assert me["max_pct_of_core"] > 20
    assert 0 < summary["machine_cpu_pct"]["mean"] <= 100


def test_sampler_finds_a_process_by_exact_name():
    name = "fe" + uuid.uuid4().hex[:10]
    # The child renames itself (its comm), then spins until killed.
    child = subprocess.Popen([sys.executable, "-c",
                              f"open('/proc/self/comm', 'w').write('{name}')\n"
                              "while True: pass"])
    try:
        deadline = time.monotonic() + 5
        while not PsutilReader().find_pids(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert PsutilReader().find_pids(name) == [child.pid]
        sampler = CpuSampler((name, "no-such-process-x"), interval_s=0.05)
        sampler.start()
        time.sleep(0.4)
        summary = sampler.stop()
    finally:
        child.kill()
        child.wait()
    assert summary["processes"][name]["pids"] == [child.pid]
    assert summary["processes"][name]["max_pct_of_core"] > 10
    assert summary["processes"]["no-such-process-x"] == {
        "mean_pct_of_core": None, "max_pct_of_core": None, "pids": [],
        "found": False}
    assert sampler.stop() is summary          # idempotent


def test_stop_does_not_wait_for_the_interval():
    sampler = CpuSampler(interval_s=30).start()
    began = time.monotonic()
    summary = sampler.stop()
    assert time.monotonic() - began < 1.0
    assert summary["samples"] == 0
    assert summary["machine_cpu_pct"] == {"mean": None, "max": None}


def test_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="interval_s must be a positive"):
        CpuSampler(interval_s=0)
    with pytest.raises(ValueError, match="process_names must be a sequence"):
        CpuSampler("ovs-vswitchd")
    with pytest.raises(RuntimeError, match="before start"):
        CpuSampler().stop()


# on_sample: each sample handed over as the thread takes it -----------------

def wait_for(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class ClimbingReader(FakeReader):
    """A machine whose busy time climbs 1 s per 2 s of total at every reading."""

    def machine(self):
        self.busy_s += 1.0
        self.total_s += 2.0
        return super().machine()


def test_on_sample_gets_each_sample_from_the_sampler_thread():
    import threading

    seen = []
    sampler = CpuSampler(("ovs-vswitchd",), interval_s=0.01, reader=ClimbingReader(),
                         on_sample=lambda s: seen.append((s, threading.current_thread().name)))
    sampler.start()
    wait_for(lambda: len(seen) >= 3)
    sampler.stop()
    samples = [s for s, _ in seen]
    assert {name for _, name in seen} == {"cpu-sampler"}
    # The very samples recorded, in order (stop() may add a tail sample of its own).
    assert samples == sampler.samples[:len(samples)]
    assert all(s.machine_pct == pytest.approx(50.0) for s in samples)


def test_an_on_sample_that_raises_is_dropped_and_sampling_goes_on(caplog):
    calls = []

    def broken(sample):
        calls.append(sample)
        raise ValueError("a watcher's bug")

    sampler = CpuSampler((), interval_s=0.01, reader=ClimbingReader(), on_sample=broken)
    with caplog.at_level("ERROR", logger="emu.cpu"):
        sampler.start()
        wait_for(lambda: len(sampler.samples) >= 4)
        summary = sampler.stop()                     # no error: the run is not failed
    assert len(calls) == 1, "dropped after it raised"
    assert sampler.on_sample is None
    assert summary["samples"] >= 4 and summary["machine_cpu_pct"]["max"] == pytest.approx(50.0)
    assert "on_sample failed" in caplog.text and "a watcher's bug" in caplog.text


def test_without_on_sample_nothing_is_handed_over():
    sampler = CpuSampler((), interval_s=0.01, reader=ClimbingReader())
    assert sampler.on_sample is None
    sampler.start()
    wait_for(lambda: len(sampler.samples) >= 2)
    assert sampler.stop()["samples"] >= 2
