"""The web view's wiring into a run, without a network: ``emu.run --web``/``--web-port``
(refused before anything is created where they cannot apply), `emu.run.watched`
and ``result["web_view"]`` (with `_emulate` and the view's server replaced by
fakes), the live CPU events of `emu.live.series.TestbedSeries` (with a fake
testbed and sampler), and the circuits panel of `emu.view.page.FabricPage`.

Nothing here builds a network, needs root or opens a socket.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from emu import run as emu_run
from emu import scenario as scenarios
from emu.experiments.base import Outcome
from emu.live import drops
from emu.live import series as series_module
from emu.live.cpu import CpuSample
from emu.live.feed import EVENTS_FILE, RunFeed, read_events
from emu.view import server as view_server
from emu.view.page import FabricPage
from tests.unit.test_view_state import (PD_SCALE, PD_SPEC, T0, make_testbed, ocs_run, pd_run,
                                        state_of)


def _main(argv, out: Path) -> int:
    return emu_run.main(list(argv) + ["--out", str(out)])


def _refuse(*_args, **_kwargs):
    raise AssertionError("bad input must be refused before a run starts")


@pytest.fixture
def never_run(monkeypatch):
    """Pretend to be root, so that only the --web checks can refuse; a test that got
    past them would fail here instead of running anything."""
    monkeypatch.setattr(emu_run.os, "geteuid", lambda: 0)
    for name in ("execute", "lab", "_emulate", "_model", "dataplane_of"):
        monkeypatch.setattr(emu_run, name, _refuse)


# ------------------------------------------------------------ emu.run: bad input
@pytest.mark.parametrize("argv", [
    ["cost"], ["fabrics"], ["pd-calc"],
    ["allreduce", "--set", "engine=model"], ["rfabric", "--set", "engine=model"]],
    ids=lambda argv: " ".join(argv))
def test_web_on_a_scenario_that_emulates_nothing_is_bad_input(argv, tmp_path, capsys,
                                                              never_run):
    assert _main(argv + ["--web"], tmp_path) == emu_run.EXIT_BAD_INPUT == 2
    err = capsys.readouterr().err
    assert "--web watches an emulated network" in err
    assert not any(tmp_path.iterdir()), "nothing may be created"


@pytest.mark.parametrize("port", ["65536", "-1", "100000"])
def test_a_web_port_outside_0_65535_is_bad_input(port, tmp_path, capsys, never_run):
    assert _main(["ocs-reconfig", "--web", f"--web-port={port}"], tmp_path) == 2
    assert f"--web-port {port}: must be 0-65535" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("port", ["0", "65535"])
def test_the_ends_of_the_port_range_pass_the_port_check(port, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(emu_run.os, "geteuid", lambda: 1000)   # stopped by the root check
    for name in ("execute", "lab", "_emulate"):
        monkeypatch.setattr(emu_run, name, _refuse)
    assert _main(["ocs-reconfig", "--web", f"--web-port={port}"], tmp_path) == 2
    err = capsys.readouterr().err
    assert "needs root" in err and "--web-port" not in err
    assert not any(tmp_path.iterdir())


def test_web_without_web_on_a_calculation_still_runs(tmp_path, monkeypatch):
    """Only --web is refused on a calculation: the same run without it is fine."""
    calls = []
    monkeypatch.setattr(emu_run, "execute", lambda *args: calls.append(args) or 0)
    assert _main(["cost"], tmp_path) == 0
    (scenario, out, web), = calls
    assert scenario.name == "cost" and out == tmp_path
    assert web == emu_run.WebSetting(False, 0)


@pytest.mark.parametrize("cli", [False, True], ids=["run", "cli"])
def test_main_hands_the_web_setting_on(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(emu_run.os, "geteuid", lambda: 0)
    monkeypatch.setattr(emu_run, "dataplane_of",
                        lambda scenario: SimpleNamespace(describe=lambda: "a fake data plane"))
    calls = []
    monkeypatch.setattr(emu_run, "execute", lambda scenario, out, web: calls.append(web) or 0)
    monkeypatch.setattr(emu_run, "lab",
                        lambda scenario, out, script, web: calls.append(("cli", web)) or 0)
    argv = ["ocs-reconfig", "--web", "--web-port", "8123"] + (["--cli"] if cli else [])
    assert _main(argv, tmp_path) == 0
    web = emu_run.WebSetting(True, 8123)
    assert calls == [("cli", web) if cli else web]


# ------------------------------------------------------------ emu.run.watched
class FakeView:
    def __init__(self, port):
        self.port = port or 8999
        self.url = f"http://127.0.0.1:{self.port}/?token=secret"
        self.stopped = False

    def stop(self):
        self.stopped = True


@pytest.fixture
def fake_server(monkeypatch):
    """serve_live replaced: records what it was given, and what became of it."""
    made = SimpleNamespace(views=[], listeners=[], unsubscribed=0, ports=[], titles=[])

    def serve_live(subscribe, port=0, title="fabric"):
        view = FakeView(port)
        made.views.append(view)
        made.ports.append(port)
        made.titles.append(title)
        detach = subscribe(made.listeners.append)

        def unsubscribe():
            made.unsubscribed += 1
            detach()
        return view, None, unsubscribe

    monkeypatch.setattr(view_server, "serve_live", serve_live)
    return made


def test_watched_without_web_records_events_and_closes_the_feed(tmp_path, capsys, fake_server):
    run_dir = tmp_path / "run"
    with emu_run.watched(run_dir, emu_run.WebSetting(False)) as feed:
        assert isinstance(feed, RunFeed)
        assert feed.path == run_dir / EVENTS_FILE
        feed.emit("phase", name="rollout", iteration=1)
        assert feed._stream is not None
    assert feed._stream is None, "the feed is closed on leaving the block"
    assert [e["kind"] for e in read_events(run_dir / EVENTS_FILE)] == ["phase"]
    assert fake_server.views == []                 # no web view was started
    assert "web view" not in capsys.readouterr().out


def test_watched_closes_the_feed_when_the_run_fails(tmp_path, fake_server):
    with pytest.raises(RuntimeError, match="boom"):
        with emu_run.watched(tmp_path, emu_run.WebSetting(True, 8124)) as feed:
            feed.emit("phase", name="rollout")
            raise RuntimeError("boom")
    assert feed._stream is None
    (view,) = fake_server.views
    assert view.stopped and fake_server.unsubscribed == 1


def test_watched_with_web_serves_the_feed_then_stops(tmp_path, capsys, fake_server):
    run_dir = tmp_path / "ocs-reconfig-20260101-000000"
    with emu_run.watched(run_dir, emu_run.WebSetting(True, 8125)) as feed:
        feed.emit("phase", name="rollout")
        (view,) = fake_server.views
        assert not view.stopped
        out = capsys.readouterr().out
        assert f"web view: {view.url}" in out
        assert "ssh -L 8125:127.0.0.1:8125" in out
    assert fake_server.ports == [8125]
    assert fake_server.titles == [f"emu.run {run_dir.name}"]
    assert [e["kind"] for e in fake_server.listeners] == ["phase"]   # the view got the feed
    assert view.stopped and fake_server.unsubscribed == 1
    feed.emit("late", note="after the block")           # no longer handed to the view
    assert [e["kind"] for e in fake_server.listeners] == ["phase"]
    assert f"web view stopped; replay: python -m emu.view {run_dir}" in capsys.readouterr().out


# ------------------------------------------------------------ emu.run.execute
def _run_dir(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def _result(out: Path) -> dict:
    return json.loads((_run_dir(out) / "result.json").read_text())


@pytest.fixture
def fake_emulation(monkeypatch):
    """_emulate replaced: emits one event and one fidelity warning, or raises."""
    calls = []

    def emulate(scenario, fabric, scale, run_dir, result, feed=None):
        calls.append(feed)
        assert feed is not None and feed.path == run_dir / EVENTS_FILE
        feed.emit("phase", name="rollout", iteration=1)
        result["fidelity"] = {"warnings": ["datapath saturated"]}
        if getattr(emulate, "fail", False):
            raise RuntimeError("the testbed fell over")
        return Outcome(metrics={"x_count": 1})

    monkeypatch.setattr(emu_run, "_emulate", emulate)
    emulate.calls = calls
    return emulate


@pytest.mark.parametrize("on", [False, True], ids=["web off", "web on"])
def test_an_emulated_run_records_whether_the_web_view_was_on(on, tmp_path, fake_emulation,
                                                              fake_server):
    scenario = scenarios.load("ocs-reconfig", [])
    assert scenario.emulates
    assert emu_run.execute(scenario, tmp_path, emu_run.WebSetting(on, 0)) == 0
    result = _result(tmp_path)
    assert result["status"] == "ok"
    assert result["web_view"] is on
    assert len(fake_emulation.calls) == 1
    assert len(fake_server.views) == (1 if on else 0)
    run_dir = _run_dir(tmp_path)
    events = read_events(run_dir / EVENTS_FILE)
    assert [e["kind"] for e in events] == ["phase", "warning", "run"]
    assert events[1]["text"] == "datapath saturated"
    assert events[2]["status"] == "ended"
    if on:
        assert [e["kind"] for e in fake_server.listeners] == ["phase", "warning", "run"]
        assert fake_server.views[0].stopped
    report = (run_dir / "report.md").read_text()
    assert "## Web view" in report
    assert f"The web view was {'on' if on else 'off'} during this run" in report
    assert f"`python -m emu.view {run_dir.name}`" in report


def test_a_failed_emulation_still_ends_its_feed(tmp_path, fake_emulation, fake_server, capsys):
    fake_emulation.fail = True
    scenario = scenarios.load("ocs-reconfig", [])
    assert emu_run.execute(scenario, tmp_path, emu_run.WebSetting(True, 0)) == 1
    result = _result(tmp_path)
    assert result["status"].startswith("failed: RuntimeError")
    assert result["web_view"] is True
    events = read_events(_run_dir(tmp_path) / EVENTS_FILE)
    assert [e["kind"] for e in events] == ["phase", "warning", "run"]
    assert fake_server.views[0].stopped


def test_a_calculation_records_no_web_view(tmp_path, fake_server):
    scenario = scenarios.load("pd-calc", [])
    assert not scenario.emulates
    assert emu_run.execute(scenario, tmp_path) == 0
    result = _result(tmp_path)
    assert result["status"] == "ok" and "web_view" not in result
    run_dir = _run_dir(tmp_path)
    assert not (run_dir / EVENTS_FILE).exists()
    assert "## Web view" not in (run_dir / "report.md").read_text()


# ------------------------------------------------------------ TestbedSeries: live CPU
def cpu(machine_pct, softirq_pct=1.0, vswitchd=30.0) -> CpuSample:
    return CpuSample(t=T0, duration_s=0.5, machine_pct=machine_pct,
                     process_pct_of_core={"ovs-vswitchd": vswitchd}, softirq_pct=softirq_pct)


def recording_series(tmp_path, cpu_alarm_pct=90.0):
    feed = RunFeed()                           # no file: handed to listeners only
    events = []
    feed.subscribe(events.append)
    series = series_module.TestbedSeries(tmp_path, "test", log=lambda _: None, feed=feed,
                                         cpu_alarm_pct=cpu_alarm_pct)
    return series, events


def kinds(events):
    return [e["kind"] for e in events]


def test_every_cpu_sample_is_an_event(tmp_path):
    series, events = recording_series(tmp_path)
    series._cpu_sampled(cpu(12.5, softirq_pct=3.0, vswitchd=40.0))
    series._cpu_sampled(cpu(None, softirq_pct=None, vswitchd=None))
    assert kinds(events) == ["cpu", "cpu"]
    first, second = events
    assert (first["machine_pct"], first["softirq_pct"]) == (12.5, 3.0)
    assert first["processes"] == {"ovs-vswitchd": 40.0}
    assert second["machine_pct"] is None and second["processes"] == {"ovs-vswitchd": None}
    json.dumps(events)                          # recordable as events.jsonl lines


def test_the_cpu_alarm_is_one_warning_at_the_first_sample_at_the_threshold(tmp_path):
    series, events = recording_series(tmp_path, cpu_alarm_pct=90.0)
    for pct in (50.0, 89.9, None):
        series._cpu_sampled(cpu(pct))
    assert kinds(events) == ["cpu"] * 3
    series._cpu_sampled(cpu(90.0))               # at the threshold: told at once
    assert kinds(events) == ["cpu"] * 4 + ["warning"]
    warning = events[-1]["text"]
    assert "machine CPU at 90 %" in warning and "threshold is 90 %" in warning
    for pct in (99.0, 100.0, 20.0, 95.0):
        series._cpu_sampled(cpu(pct))
    assert kinds(events) == ["cpu"] * 4 + ["warning"] + ["cpu"] * 4, "once per testbed"


def test_no_cpu_alarm_without_a_threshold(tmp_path):
    series, events = recording_series(tmp_path, cpu_alarm_pct=None)
    for pct in (100.0, 100.0):
        series._cpu_sampled(cpu(pct))
    assert kinds(events) == ["cpu", "cpu"]


def test_a_series_without_a_feed_has_its_own(tmp_path):
    series = series_module.TestbedSeries(tmp_path, "test", log=lambda _: None)
    assert isinstance(series.feed, RunFeed) and series.feed.path is None
    series._cpu_sampled(cpu(100.0))              # nowhere to record: no error


class FakeBed:
    """What TestbedSeries.open uses of a Testbed."""

    made = []

    def __init__(self, fabric, scale, folder, **options):
        self.folder, self.options = folder, options
        self.build_s, self.warnings = 0.25, []
        self.keeper = None                  # no controller restarts (`emu.live.keeper`)
        self.dataplane = SimpleNamespace(processes=("ovs-vswitchd",))
        self.closed = False
        FakeBed.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.closed = True

    def describe(self):
        return {"dataplane": "fake"}

    def drop_counters(self, log_since=0):
        return drops.Counters(vswitchd_log_bytes=log_since)

    def dump_tables(self, folder):
        pass

    def check_controller(self):
        pass

    def status(self):
        return self.options.get("status", {"ready": True})

    def controller_log(self):
        return ""


class FakeSampler:
    """A CpuSampler whose samples the test hands over itself."""

    made = []

    def __init__(self, process_names, interval_s=0.5, *, on_sample=None, **_):
        self.process_names, self.on_sample = process_names, on_sample
        FakeSampler.made.append(self)

    def start(self):
        return self

    def stop(self):
        return {"samples": 0}


@pytest.fixture
def fake_testbeds(monkeypatch):
    import emu.live.testbed

    FakeBed.made, FakeSampler.made = [], []
    monkeypatch.setattr(emu.live.testbed, "Testbed", FakeBed)
    monkeypatch.setattr(series_module, "CpuSampler", FakeSampler)
    monkeypatch.setattr(drops, "log_size", lambda *args: 0)


def test_each_testbed_warns_once_and_its_events_say_which(tmp_path, fake_testbeds):
    series, events = recording_series(tmp_path, cpu_alarm_pct=80.0)
    for label in ("fattree", "rfabric"):
        with series.open(label, fabric=None, scale=None) as bed:
            assert bed.options["feed"] is series.feed   # the testbed emits into the run's feed
            sampler = FakeSampler.made[-1]
            assert sampler.process_names == ("ovs-vswitchd",)
            assert sampler.on_sample is not None        # the series listens to its sampler
            for pct in (85.0, 99.0):
                sampler.on_sample(cpu(pct))
        assert bed.closed
        assert series.feed.label is None
    assert kinds(events) == ["cpu", "warning", "cpu"] * 2
    assert [e["label"] for e in events] == ["fattree"] * 3 + ["rfabric"] * 3
    assert set(series.cpu) == {"fattree", "rfabric"}


def test_connections_the_controller_refused_or_saw_taken_over_are_warnings(tmp_path,
                                                                            fake_testbeds):
    status = {"ready": True,
              "refused": [{"dpid": 2989, "host": "127.0.0.1", "peer": "127.0.0.1:41235",
                           "times": 2}],
              "takeovers": [{"switch": "s1", "dpid": 1, "old_peer": "127.0.0.1:50000",
                             "new_peer": "127.0.0.1:60001", "times": 1}]}
    series, _ = recording_series(tmp_path)
    with series.open("fattree", fabric=None, scale=None) as bed:
        bed.options["status"] = status
    assert series.warnings == [
        "fattree: the controller refused 2 OpenFlow connection(s) from 127.0.0.1:41235 for "
        "dpid 2989, which no switch of the fabric has",
        "fattree: switch s1: a second OpenFlow connection (127.0.0.1:60001) took over from "
        "127.0.0.1:50000 (1 time(s)); the old one was closed"]
    with series.open(None, fabric=None, scale=None):
        pass
    assert len(series.warnings) == 2, "a quiet controller adds nothing"


# ------------------------------------------------------------ FabricPage: circuits panel
def test_a_fabric_without_ocs_hides_the_circuits_table():
    state = state_of(pd_run())
    page = FabricPage(state.snapshot)
    page.show(state.snapshot(T0 + 1.5))
    assert page.circuit_table.visible is False
    assert "none, this fabric has no OCS" in page.circuit_title.text
    assert page.circuits.data["state"] == []


def test_a_fabric_with_ocs_shows_the_circuits_table():
    state = state_of(ocs_run())
    page = FabricPage(state.snapshot)
    page.show(state.snapshot(T0 + 1.5))
    assert page.circuit_table.visible is True
    assert page.circuit_title.text == "<b>Circuits</b>"
    assert page.circuits.data["state"] == ["lit"]


def test_the_circuits_panel_follows_the_testbed_that_is_open():
    """An OCS testbed, then one without OCS (a run of several fabrics), and before any."""
    events = ocs_run() + [make_testbed(PD_SPEC, PD_SCALE, t=T0 + 9.0, label="zcube")]
    state = state_of(events)
    page = FabricPage(state.snapshot, replay_span=state.span)
    page.show(state.snapshot(T0 - 1.0))                  # no testbed yet: nothing hidden
    assert page.circuit_table.visible and page.circuit_title.text == "<b>Circuits</b>"
    page.show(state.snapshot(T0 + 1.0))
    assert page.circuit_table.visible
    page.show(state.snapshot(T0 + 9.5))
    assert not page.circuit_table.visible and "no OCS" in page.circuit_title.text
    page.show(state.snapshot(T0 + 1.0))                  # the slider moved back
    assert page.circuit_table.visible and page.circuit_title.text == "<b>Circuits</b>"
