"""Tests for emu.fidelity: CPU sampling and the fidelity assessment."""

import os
import subprocess
import sys
import time
import uuid

import pytest

from emu.fidelity import (CpuSampler, CpuSnapshot, assess, cpu_sample,
                          find_pids, read_machine_cpu, read_process_cpu_s)

TICKS = os.sysconf("SC_CLK_TCK")


def write_fake_proc(root, *, cpu_ticks, processes):
    """A minimal /proc: stat with two cores, and <pid>/{comm,stat}.

    cpu_ticks: (user, nice, system, idle, iowait, irq, softirq, steal);
    processes: {pid: (comm, utime_ticks, stime_ticks)}.
    """
    fields = " ".join(str(value) for value in cpu_ticks)
    (root / "stat").write_text(f"cpu  {fields} 7 7\ncpu0 {fields}\ncpu1 {fields}\n"
                               "intr 1 2 3\nctxt 99\n")
    for pid, (comm, utime, stime) in processes.items():
        folder = root / str(pid)
        folder.mkdir(exist_ok=True)
        (folder / "comm").write_text(comm + "\n")
        # Fields 3..: state ppid pgrp session tty tpgid flags minflt cminflt
        # majflt cmajflt utime stime ...
        (folder / "stat").write_text(
            f"{pid} ({comm}) S 1 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0\n")


def busy_for(seconds):
    deadline = time.monotonic() + seconds
    count = 0
    while time.monotonic() < deadline:
        count += 1
    return count


def test_reads_fake_proc_files(tmp_path):
    write_fake_proc(tmp_path, cpu_ticks=(100, 0, 50, 800, 50, 0, 0, 0),
                    processes={42: ("ovs-vswitchd", 30, 20),
                               43: ("odd) name (x", 1, 1),
                               44: ("ovs-vswitchd-x", 5, 5)})
    busy_s, total_s, cores = read_machine_cpu(str(tmp_path))
    # guest fields (the trailing 7 7) are already inside user: not counted.
    assert (busy_s, total_s, cores) == (150 / TICKS, 1000 / TICKS, 2)
    assert read_process_cpu_s(42, str(tmp_path)) == 50 / TICKS
    assert read_process_cpu_s(43, str(tmp_path)) == 2 / TICKS
    assert find_pids("ovs-vswitchd", str(tmp_path)) == [42]
    assert find_pids("nothing", str(tmp_path)) == []
    with pytest.raises(FileNotFoundError):
        read_process_cpu_s(99, str(tmp_path))


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


def test_sampler_on_fake_proc_finds_late_process(tmp_path):
    write_fake_proc(tmp_path, cpu_ticks=(0, 0, 0, 1000, 0, 0, 0, 0), processes={})
    sampler = CpuSampler(("ovs-vswitchd",), interval_s=60, proc_root=str(tmp_path))
    sampler.take_baseline()                 # sampled by hand, no thread
    write_fake_proc(tmp_path, cpu_ticks=(500, 0, 0, 1500, 0, 0, 0, 0),
                    processes={42: ("ovs-vswitchd", 0, 0)})
    first = sampler.sample_now()
    assert first.machine_pct == pytest.approx(50.0)
    assert first.process_pct_of_core["ovs-vswitchd"] is None   # just appeared
    write_fake_proc(tmp_path, cpu_ticks=(500, 0, 0, 1500, 0, 0, 0, 0),
                    processes={42: ("ovs-vswitchd", TICKS, 0)})
    second = sampler.sample_now()
    assert second.machine_pct is None       # no ticks elapsed: undefined
    assert second.process_pct_of_core["ovs-vswitchd"] > 0
    summary = sampler.summary()
    assert summary["samples"] == 2 and summary["cores"] == 2
    assert summary["machine_cpu_pct"] == {"mean": 50.0, "max": 50.0}
    assert summary["processes"]["ovs-vswitchd"]["pids"] == [42]
    assert summary["processes"]["ovs-vswitchd"]["found"]


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
        while not find_pids(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert find_pids(name) == [child.pid]
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


def flow(flow_id, start, end, goodput, cap, links):
    return {"id": flow_id, "start": start, "end": end, "goodput_mbps": goodput,
            "cap_mbps": cap, "links": links}


IDLE_CPU = {"machine_cpu_pct": {"mean": 40.0, "max": 60.0}, "cores": 2,
            "processes": {"ovs-vswitchd": {"mean_pct_of_core": 30.0,
                                           "max_pct_of_core": 50.0}},
            "samples": 10, "interval_s": 0.5}


def test_alone_flow_below_floor_is_named_in_a_warning():
    flows = [
        flow("f1", 0, 10, 45.0, 100.0, ["s1-s2"]),       # alone, 45 %: warn
        flow("f2", 0, 10, 97.0, 100.0, ["s3-s4"]),       # alone, fine
        flow("f3", 20, 30, 30.0, 100.0, ["s5-s6", "s6-s7"]),   # shares s6-s7
        flow("f4", 25, 35, 30.0, 100.0, ["s6-s7"]),
        flow("f5", 10, 20, 10.0, 100.0, ["s1-s2"]),      # starts as f1 ends: alone
        flow("f6", 0, 5, 1.0, None, ["s9-s10"]),         # no cap: not checked
    ]
    result = assess(flows, IDLE_CPU)
    assert result["flows_checked"] == 6
    assert [row["id"] for row in result["alone_flows"]] == ["f1", "f2", "f5"]
    assert result["alone_flows"][0]["ratio"] == pytest.approx(0.45)
    assert not result["saturated"]
    assert len(result["warnings"]) == 2
    warning = result["warnings"][0]
    assert "f1" in warning and "45.0 Mbit/s" in warning and "100.0 Mbit/s" in warning
    assert "0.45" in warning
    assert "f5" in result["warnings"][1]
    assert result["cpu"] is IDLE_CPU


def test_cpu_saturation_warnings():
    machine_hot = dict(IDLE_CPU, machine_cpu_pct={"mean": 50.0, "max": 95.0})
    result = assess([], machine_hot)
    assert result["saturated"]
    assert result["warnings"][0].startswith("datapath saturated: machine CPU")
    ovs_hot = dict(IDLE_CPU, processes={"ovs-vswitchd": {
        "mean_pct_of_core": 80.0, "max_pct_of_core": 99.0}})
    result = assess([], ovs_hot, saturation_pct=95)
    assert result["saturated"]
    assert "ovs-vswitchd reached 99 % of one core" in result["warnings"][0]
    assert not assess([], ovs_hot, saturation_pct=99.5)["saturated"]
    assert assess([], None)["warnings"] == []


def test_assess_rejects_malformed_flows():
    with pytest.raises(ValueError, match=r"flow #0 \(f1\) lacks key\(s\) \['links'\]"):
        assess([{"id": "f1", "start": 0, "end": 1, "goodput_mbps": 1,
                 "cap_mbps": 1}], None)
    with pytest.raises(ValueError, match="end .* before start"):
        assess([flow("f1", 5, 1, 1, 1, [])], None)
    with pytest.raises(ValueError, match="goodput_floor"):
        assess([], None, goodput_floor=2)
