"""bench/soak's pure parts: the table of samples (by minute and process, its CSV
and its printed line), the verdict (end against the reference minute, within
1.10), the minute sampler's schedule and its argument checks.  The soak itself
opens a testbed and is never run here."""

import importlib.machinery
import importlib.util
import math
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "soak"
MiB = 2 ** 20


@pytest.fixture(scope="module")
def bench():
    loader = importlib.machinery.SourceFileLoader("bench_soak", str(BENCH))
    spec = importlib.util.spec_from_loader("bench_soak", loader)
    module = importlib.util.module_from_spec(spec)
    # Registered while it loads: its dataclasses look their module up by name.
    sys.modules["bench_soak"] = module
    try:
        loader.exec_module(module)
    finally:
        del sys.modules["bench_soak"]
    return module


def table_of(bench, minutes):
    """{minute: {process: (pid, rss MiB, fds)}} -> a SoakTable."""
    table = bench.SoakTable()
    for minute, processes in minutes.items():
        for process, values in processes.items():
            pid, rss, fds = values if values is not None else (None, None, None)
            table.add(bench.Sample(minute, process, pid, None if rss is None else rss * MiB,
                                   fds, t=1000.0 + 60 * minute))
    return table


def rows_by(rows):
    return {(r["process"], r["metric"]): r for r in rows}


def test_a_steady_soak_passes_and_a_growing_one_fails(bench):
    table = table_of(bench, {
        1: {"runner": (10, 200, 40), "controller": (20, 90, 30), "ovs-vswitchd": (30, 12, 80)},
        3: {"runner": (10, 219, 44), "controller": (20, 100, 30), "ovs-vswitchd": (30, 12, 81)},
    })
    rows = rows_by(bench.judge(table, 1, 3))
    runner_rss = rows[("runner", "rss_bytes")]
    assert runner_rss["reference"] == 200 * MiB and runner_rss["end"] == 219 * MiB
    assert runner_rss["ratio"] == pytest.approx(1.095) and runner_rss["verdict"] == "PASS"
    assert rows[("runner", "fds")]["ratio"] == pytest.approx(1.1), "exactly 1.10 passes"
    assert rows[("runner", "fds")]["verdict"] == "PASS"
    controller = rows[("controller", "rss_bytes")]
    assert controller["ratio"] == pytest.approx(100 / 90) and controller["verdict"] == "FAIL"
    assert not bench.passed(rows.values())
    assert bench.passed([r for r in rows.values() if r["process"] != "controller"])


def test_a_restarted_or_vanished_process_fails_and_one_never_running_is_not_judged(bench):
    table = table_of(bench, {
        10: {"runner": (10, 200, 40), "controller": (20, 90, 30), "ovs-vswitchd": None},
        30: {"runner": None, "controller": (21, 60, 25), "ovs-vswitchd": None},
    })
    rows = rows_by(bench.judge(table, 10, 30))
    assert rows[("controller", "rss_bytes")]["verdict"] == "FAIL"
    assert "restarted: pid 20 at minute 10, 21 at minute 30" in \
        rows[("controller", "rss_bytes")]["note"]
    assert rows[("runner", "fds")]["verdict"] == "FAIL"
    assert rows[("runner", "fds")]["note"] == "gone by minute 30"
    assert rows[("ovs-vswitchd", "rss_bytes")]["verdict"] == "ABSENT", \
        "no ovs-vswitchd on the linux data plane: nothing to judge"


def test_a_minute_never_sampled_fails_and_zero_stays_zero(bench):
    table = table_of(bench, {0: {"runner": (10, 200, 0)}, 5: {"runner": (10, 200, 0)}})
    rows = rows_by(bench.judge(table, 0, 5))
    assert rows[("runner", "fds")]["ratio"] == 1.0
    missing = rows_by(bench.judge(table, 0, 9))
    assert missing[("runner", "rss_bytes")]["verdict"] == "FAIL"
    assert missing[("runner", "rss_bytes")]["note"] == "gone by minute 9"
    grown = table_of(bench, {0: {"runner": (10, 200, 0)}, 5: {"runner": (10, 200, 3)}})
    assert math.isinf(rows_by(bench.judge(grown, 0, 5))[("runner", "fds")]["ratio"])


def test_unreadable_values_fail_with_a_hint(bench):
    table = bench.SoakTable()
    for minute in (1, 3):
        table.add(bench.Sample(minute, "controller", 20, None, None))
    row = rows_by(bench.judge(table, 1, 3))[("controller", "rss_bytes")]
    assert row["verdict"] == "FAIL" and "root" in row["note"]


def test_the_table_round_trips_through_its_csv(bench, tmp_path):
    table = table_of(bench, {
        0: {"runner": (10, 200, 40), "controller": (20, 90, 30), "ovs-vswitchd": None},
        1: {"runner": (10, 201, 41), "controller": (20, 91, 30), "ovs-vswitchd": (30, 12, 80)},
    })
    path = tmp_path / "soak.csv"
    table.write_csv(path)
    lines = path.read_text().splitlines()
    assert lines[0] == "minute,t,process,pid,rss_bytes,fds"
    assert lines[1] == f"0,1000.0,runner,10,{200 * MiB},40"
    assert lines[3] == "0,1000.0,ovs-vswitchd,,,", "a process not running: empty cells"
    assert not (tmp_path / "soak.csv.tmp").exists()
    again = bench.SoakTable.read_csv(path)
    assert again.minutes() == [0, 1]
    for minute in (0, 1):
        for process in bench.PROCESSES:
            assert again.get(minute, process) == table.get(minute, process)


def test_the_printed_minute_and_verdict(bench):
    table = table_of(bench, {2: {"runner": (10, 200, 40), "controller": (20, 90.5, 30),
                                 "ovs-vswitchd": None}})
    assert table.line(2) == ("minute   2: runner 200.0 MiB 40 fds | controller 90.5 MiB 30 fds "
                             "| ovs-vswitchd -")
    table.add(bench.Sample(4, "runner", 10, 210 * MiB, 40))
    lines = bench.verdict_lines(bench.judge(table, 2, 4))
    assert lines[0].split()[:6] == ["process", "measure", "minute", "2", "minute", "4"]
    assert "target <= 1.10" in lines[0]
    runner = next(line for line in lines if line.startswith("runner") and "RSS" in line)
    assert "200.0 MiB" in runner and "210.0 MiB" in runner and "1.050" in runner \
        and runner.endswith("PASS")
    assert any("ABSENT (not running)" in line for line in lines)


def test_the_table_refuses_a_process_it_does_not_know(bench):
    with pytest.raises(ValueError, match="unknown process"):
        bench.SoakTable().add(bench.Sample(0, "tcpdump", 1, 1, 1))


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_sampler_takes_each_minute_once_between_rounds_then_says_done(bench):
    table, seen, clock = bench.SoakTable(), [], _Clock()
    sampler = bench.MinuteSampler(lambda: {"runner": os.getpid(), "controller": None,
                                           "ovs-vswitchd": None},
                                  3, table, on_minute=seen.append, interval_s=60,
                                  clock=clock).start()
    sampler.poll()
    assert seen == [0], "minute 0 as serving starts"
    clock.now = 59.0
    sampler.poll()
    assert seen == [0], "no minute before its time"
    clock.now = 61.0
    sampler.poll()
    sampler.poll()
    assert seen == [0, 1], "each minute once"
    clock.now = 200.0           # a round that spanned two minutes
    sampler.poll()
    assert seen == [0, 1, 2, 3] and sampler.done
    assert table.minutes() == [0, 1, 2, 3]
    me = table.get(3, "runner")
    assert me.pid == os.getpid() and me.rss_bytes > 0 and me.fds > 0
    assert table.get(3, "controller").pid is None


def test_a_sampler_polled_before_it_started_says_so(bench):
    with pytest.raises(RuntimeError, match="before start"):
        bench.MinuteSampler(lambda: {}, 3, bench.SoakTable()).poll()


def test_a_gone_process_is_sampled_as_not_running(bench):
    gone = bench.measure("controller", 2 ** 22 + 12345, 1, 0.0)
    assert gone.pid is None and gone.rss_bytes is None


@pytest.mark.parametrize("argv,message", [
    (["--minutes", "0"], "--minutes must be 1 or more"),
    (["--minutes", "3", "--reference-minute", "3"], "--reference-minute must be from 0 to 2"),
    (["--limit", "0.9"], "--limit is a ratio"),
])
def test_arguments_are_checked(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_defaults_and_the_smoke_mode(bench):
    args = bench.parse_args([])
    assert (args.minutes, args.reference_minute, args.limit) == (30, 10, 1.10)
    smoke = bench.parse_args(["--minutes", "3", "--reference-minute", "1"])
    assert (smoke.minutes, smoke.reference_minute) == (3, 1)


def test_the_stream_it_serves_is_pd_inference_s_first_fabric(bench):
    loaded, name, fabric, scale, serving, planned = bench.load_stream([], None)
    assert name == loaded.section["fabrics"][0] == "zcube"
    assert len(planned) == loaded.section["requests"]
    assert serving.link_mbps == loaded.config["scale"]["link_mbps"]
    with pytest.raises(SystemExit, match="not one of the scenario's fabrics"):
        bench.load_stream([], "railfly")
