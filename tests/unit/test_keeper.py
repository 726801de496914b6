"""The controller's keeper against real processes (``sleep``), killed with SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from emu.live.keeper import ControllerKeeper

WAIT_S = 5.0


@pytest.fixture
def processes():
    """Every sleep a test starts; each is killed and reaped at the end."""
    started = []

    def sleeper():
        process = subprocess.Popen(["sleep", "30"])
        started.append(process)
        return process
    yield sleeper
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(WAIT_S)


def restarter(sleeper, calls):
    def restart():
        process = sleeper()
        calls.append(process)
        return process, time.time()
    return restart


def test_a_killed_controller_gets_a_successor_and_an_outage_is_recorded(processes):
    first, calls, lines = processes(), [], []
    keeper = ControllerKeeper(first, restarter(processes, calls), log=lines.append).start()
    try:
        first.send_signal(signal.SIGKILL)
        assert keeper.wait_after_failure(WAIT_S), f"no successor: {keeper.failed}"
        assert len(calls) == 1 and keeper.process is calls[0] and keeper.failed is None
        assert calls[0].poll() is None, "the successor runs"
        (outage,) = keeper.outages
        assert outage["exit_code"] == -signal.SIGKILL and outage["pid"] == first.pid
        assert outage["successor_pid"] == calls[0].pid
        assert 0 <= outage["resync_s"] <= outage["outage_s"] < WAIT_S
        assert any(str(first.pid) in line for line in lines), lines
    finally:
        keeper.stop()


def test_a_controller_that_exits_after_stop_is_not_replaced(processes):
    first, calls = processes(), []
    keeper = ControllerKeeper(first, restarter(processes, calls), log=lambda _: None).start()
    keeper.stop()
    first.kill()
    keeper._thread.join(WAIT_S)
    assert not keeper._thread.is_alive(), "the keeper ends with its controller"
    assert calls == [] and keeper.outages == [] and keeper.failed is None


def test_a_restart_that_raises_makes_the_keeper_give_up(processes):
    first = processes()

    def restart():
        raise RuntimeError("no switch answered")
    keeper = ControllerKeeper(first, restart, log=lambda _: None).start()
    try:
        first.kill()
        assert not keeper.wait_after_failure(WAIT_S)
        assert "no switch answered" in keeper.failed
        assert keeper.outages[0]["error"] == "no switch answered"
        assert not keeper.restarting
    finally:
        keeper.stop()


def test_the_keeper_gives_up_after_max_restarts(processes):
    first, calls = processes(), []
    keeper = ControllerKeeper(first, restarter(processes, calls), log=lambda _: None,
                              max_restarts=1).start()
    try:
        first.kill()
        assert keeper.wait_after_failure(WAIT_S)
        calls[0].kill()
        assert not keeper.wait_after_failure(WAIT_S), "a second death is one too many"
        assert len(calls) == 1 and keeper.failed and "2 times" in keeper.failed
        assert [o.get("error") is None for o in keeper.outages] == [True, False]
    finally:
        keeper.stop()


def test_a_request_failing_while_the_controller_lives_waits_only_the_grace(processes):
    first, calls = processes(), []
    keeper = ControllerKeeper(first, restarter(processes, calls), log=lambda _: None).start()
    try:
        started = time.monotonic()
        assert not keeper.wait_after_failure(WAIT_S, grace_s=0.2), \
            "a live controller has no successor"
        assert time.monotonic() - started < 2 and calls == []
    finally:
        keeper.stop()
