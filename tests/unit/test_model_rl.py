"""ModelIterationRunner: RL iterations on the flow-level model, with and without
the RFabric control proxy (the rfabric scenario's 16-GPU setup)."""

from __future__ import annotations

import pytest

from controllers.ocs_core import delay_ms_for
from controllers.proxy_core import ControlProxy
from emu.experiments import rfabric
from emu.experiments.base import host_gbps
from topologies import registry
from traffic.flows import Flow, FlowDag
from traffic.model import calibration
from traffic.model.calibration import Calibration
from traffic.model.network import ModelNetwork, key_of
from traffic.model.rl import ModelIterationRunner
from traffic.phases import Phase, Schedule
from traffic.scale import Scale

SPEC = "rfabric,pods=2,train_pods=1"          # emu/scenarios/rfabric.toml
LINK_MBPS, TDF = 10.0, 100.0                  # its [scale]
SETTINGS = {key: field.default for key, field in rfabric.FIELDS.items()}
TOL = 1e-9


def _setup(name="rfabric", preset="mems"):
    specs = rfabric.fabric_specs(SPEC, ["fattree", "rfabric"], preset)
    fabric = registry.build(specs[name])
    scale = Scale.from_rates(host_gbps(fabric), LINK_MBPS, tdf=TDF)
    cfg = rfabric.workload(SETTINGS)
    sched = rfabric.schedule_for(cfg, fabric.hosts, scale, SETTINGS["max_ops"])
    return fabric, scale, cfg, sched


def _run(name="rfabric", preset="mems", mode="proactive", iterations=2, cal=calibration.IDEAL,
         proxy=True):
    fabric, scale, cfg, sched = _setup(name, preset)
    control = (ControlProxy(fabric, mode=mode, tdf=scale.tdf)
               if proxy and fabric.name == "rfabric" else None)
    runner = ModelIterationRunner(fabric, sched, lambda g: scale.emu_mbps(g) * 1e6, cal,
                                  optimizer_s=scale.emu_seconds(cfg.compute.optimizer_s),
                                  proxy=control, tdf=scale.tdf, log=lambda _m: None)
    runner.run(iterations)
    return runner, sched, scale, cfg


# ---------------------------------------------------------------- phases
@pytest.mark.parametrize("name", ["fattree", "rfabric"])
def test_every_phase_ends_in_order(name):
    runner, sched, scale, cfg = _run(name, iterations=2)
    optimizer_s = scale.emu_seconds(cfg.compute.optimizer_s)
    assert optimizer_s > 0
    assert len(runner.iterations) == 2
    kinds = {p.kind for p in sched.phases}
    assert {"train-dp", "weight-sync"} <= kinds
    previous_end = None
    for it in runner.iterations:
        assert it.duration_s > 0
        assert it.end > it.start
        if previous_end is not None:
            assert it.start >= previous_end - TOL
        previous_end = it.end
        runs = {p.name: p for p in it.phases}
        assert set(runs) == set(sched.names())
        for phase in sched.phases:
            run = runs[phase.name]
            assert run.end > run.start >= run.ready - TOL, phase.name
            assert run.ready >= it.start + phase.start_s - TOL, phase.name
            assert run.end <= it.end + TOL
            assert run.flows_count == len(phase.dag.flows) > 0
            assert len(run.flows) == run.flows_count
            assert all(f.status == "ok" and f.end > f.start for f in run.flows)
            for before in phase.after:
                assert run.ready >= runs[before].end - TOL, (phase.name, before)
                assert run.start >= runs[before].end - TOL, (phase.name, before)
        dp = next(p for p in sched.phases if p.kind == "train-dp")
        sync = next(p for p in sched.phases if p.kind == "weight-sync")
        assert runs[sync.name].start >= runs[dp.name].end + optimizer_s - TOL
        assert it.end == pytest.approx(max(p.end for p in it.phases))


def test_flows_are_named_per_fabric_and_iteration():
    runner, sched, _, _ = _run("fattree", iterations=2)
    flows = runner.flows("ft")
    per_iteration = sum(len(p.dag.flows) for p in sched.phases)
    assert len(flows) == 2 * per_iteration
    assert len({f.id for f in flows}) == len(flows)
    assert all(f.id.startswith(("ft-i1-", "ft-i2-")) for f in flows)


# ---------------------------------------------------------------- reconfiguration
def _windows_in(runner, it):
    return [w for w in runner.dark_windows() if it.start - TOL <= w["start"] < it.end]


def test_proactive_hides_reconfiguration_after_profiling():
    runner, *_ = _run("rfabric", mode="proactive", iterations=3)
    first, *later = runner.iterations
    assert first.exposed_s > 0
    assert any(p.stall_s > 0 for p in first.phases)
    for it in later:
        assert it.exposed_s < first.exposed_s
        assert it.exposed_s == pytest.approx(0.0, abs=1e-6)
    assert runner.proxy.reconfigs        # it still reconfigures, ahead of the phases
    assert any(_windows_in(runner, it) for it in later)


def test_reactive_exposes_the_full_delay_every_iteration():
    runner, _, scale, _ = _run("rfabric", mode="reactive", iterations=3)
    delay = delay_ms_for("mems") / 1000 * scale.tdf
    for it in runner.iterations:
        windows = _windows_in(runner, it)
        assert windows, f"iteration {it.iteration} did not reconfigure"
        assert it.exposed_s >= delay - 1e-6
        # with no control overhead (IDEAL), every phase waits out its circuits' dark time
        assert it.exposed_s == pytest.approx(len(windows) * delay, rel=0.05)
    exposed = [it.exposed_s for it in runner.iterations]
    assert max(exposed) - min(exposed) < 0.05 * max(exposed)


def test_static_never_reconfigures():
    runner, *_ = _run("rfabric", mode="static", iterations=2)
    assert runner.dark_windows() == []
    assert runner.worker.replies == []
    assert all(it.exposed_s == 0 for it in runner.iterations)


def test_static_matches_no_proxy():
    static, *_ = _run("rfabric", mode="static", iterations=2)
    bare, *_ = _run("rfabric", iterations=2, proxy=False)
    assert [it.duration_s for it in static.iterations] == \
        pytest.approx([it.duration_s for it in bare.iterations])


def test_slower_technology_exposes_more_in_iteration_one():
    mems, *_ = _run("rfabric", preset="mems", iterations=1)
    lc, *_ = _run("rfabric", preset="lc", iterations=1)
    assert lc.iterations[0].exposed_s > mems.iterations[0].exposed_s > 0
    assert lc.iterations[0].duration_s > mems.iterations[0].duration_s


@pytest.mark.parametrize("preset", ["mems", "lc"])
def test_dark_windows_last_the_delay_times_tdf(preset):
    runner, *_ = _run("rfabric", preset=preset, iterations=2)
    windows = runner.dark_windows()
    assert windows
    delay = delay_ms_for(preset) / 1000 * TDF
    ocs = set(runner.fabric.ocs_switches)
    for w in windows:
        assert w["ocs"] in ocs
        assert w["lit"] - w["torn"] == pytest.approx(delay)
        assert w["dark_s"] == pytest.approx(delay)
        assert w["start"] <= w["torn"] <= w["lit"] <= w["ready"]


def test_control_rounds_frame_each_dark_window():
    cal = Calibration(round_s=0.05)
    runner, *_ = _run("rfabric", iterations=1, cal=cal)
    delay = delay_ms_for("mems") / 1000 * TDF
    for w in runner.dark_windows():
        assert w["torn"] - w["start"] == pytest.approx(2 * 0.05)
        assert w["ready"] - w["lit"] == pytest.approx(0.05)
        assert w["lit"] - w["torn"] == pytest.approx(delay)
    # one control worker: reconfigurations never overlap
    windows = sorted(runner.dark_windows(), key=lambda w: w["start"])
    for a, b in zip(windows, windows[1:]):
        assert b["start"] >= a["ready"] - TOL


# ---------------------------------------------------------------- closed form
def _one_flow_schedule(src, dst, nbytes, start_s=0.0):
    dag = FlowDag([Flow("f0", src, dst, nbytes, group="solo")])
    phase = Phase(name="solo", kind="train-dp", stage="train", window="Large",
                  start_s=start_s, dag=dag)
    return Schedule([phase], Scale())


@pytest.mark.parametrize("cal", [calibration.IDEAL,
                                 Calibration(efficiency=0.8, startup_s=0.05,
                                             hop_latency_s=0.002)])
def test_one_flow_on_an_idle_fabric_takes_the_closed_form(cal):
    fabric = registry.build("fattree,k=4")
    src, dst = fabric.hosts[0], fabric.hosts[-1]           # different pods: 6 links
    nbytes = 3_000_000
    sched = _one_flow_schedule(src, dst, nbytes, start_s=0.25)
    bps_of = lambda g: g * 1e7                             # noqa: E731  (10 Mbit/s per Gbit/s)
    runner = ModelIterationRunner(fabric, sched, bps_of, cal, log=lambda _m: None)
    runner.run(1)
    net = ModelNetwork(fabric, bps_of)
    indptr, links = net.paths([src], [dst], [key_of("i1/solo/f0")])
    path = links[indptr[0]:indptr[1]]
    assert len(path) == 6
    rate = min(net.capacity_bps[path])
    expected = nbytes * 8 / (rate * cal.efficiency) + cal.startup_s + 6 * cal.hop_latency_s
    (it,) = runner.iterations
    (run,) = it.phases
    assert run.ready == pytest.approx(it.start + 0.25)
    assert run.start == pytest.approx(run.ready)
    assert run.duration_s == pytest.approx(expected, rel=1e-9)
    assert it.duration_s == pytest.approx(0.25 + expected, rel=1e-9)
    (flow,) = run.flows
    assert flow.end - flow.start == pytest.approx(expected, rel=1e-9)


def test_two_flows_sharing_a_host_link_take_twice_as_long():
    fabric = registry.build("fattree,k=4")
    src = fabric.hosts[0]
    dag = FlowDag([Flow("a", src, fabric.hosts[-1], 1_000_000),
                   Flow("b", src, fabric.hosts[-5], 1_000_000)])
    sched = Schedule([Phase(name="two", kind="train-dp", stage="train", window="Large",
                            start_s=0.0, dag=dag)], Scale())
    runner = ModelIterationRunner(fabric, sched, lambda g: g * 1e7, calibration.IDEAL,
                                  log=lambda _m: None)
    runner.run(1)
    host_bps = min(d["gbps"] for _, _, d in fabric.graph.edges(src, data=True)) * 1e7
    expected = 2 * 1_000_000 * 8 / host_bps
    assert runner.iterations[0].duration_s == pytest.approx(expected, rel=1e-9)


# ---------------------------------------------------------------- determinism
def test_the_compiled_loop_routes_as_the_network_does():
    # The engine routes the flows it releases from the network's tables;
    # routed by the runner's own router instead (a Python call at every
    # release), RFabric's circuits, reroutes and phases come out the same.
    def times(compiled):
        fabric, scale, cfg, sched = _setup("rfabric")
        runner = ModelIterationRunner(fabric, sched, lambda g: scale.emu_mbps(g) * 1e6,
                                      calibration.IDEAL, proxy=ControlProxy(fabric,
                                                                            tdf=scale.tdf),
                                      tdf=scale.tdf, log=lambda _m: None)
        if not compiled:
            runner.sim.tables = None
        runner.run(2)
        return ([(p.name, p.start, p.end) for it in runner.iterations for p in it.phases],
                runner.sim.end_s.tolist(), runner.sim.events_processed)

    assert times(True) == times(False)


def test_same_schedule_twice_gives_identical_times():
    def times(runner):
        return [(p.name, p.ready, p.start, p.end) for it in runner.iterations
                for p in it.phases]

    a, *_ = _run("rfabric", iterations=2, cal=Calibration(efficiency=0.9, startup_s=0.01,
                                                          hop_latency_s=0.001, round_s=0.02))
    b, *_ = _run("rfabric", iterations=2, cal=Calibration(efficiency=0.9, startup_s=0.01,
                                                          hop_latency_s=0.001, round_s=0.02))
    assert times(a) == times(b)
    assert a.dark_windows() == b.dark_windows()
    assert [(f.id, f.start, f.end) for f in a.flows("x")] == \
        [(f.id, f.start, f.end) for f in b.flows("x")]


def test_schedule_arrays_shared_by_two_fabrics_give_the_runs_of_their_own():
    from traffic.model.phase_arrays import ScheduleArrays

    fabric, scale, cfg, sched = _setup("fattree")
    arrays = ScheduleArrays(sched).prepare(2)
    phase = sched.phases[0]
    flows = phase.dag.flows
    assert [key_of(f"i2/{phase.name}/{f.id}") for f in flows] == arrays.keys(2, 0).tolist()
    own = arrays.phases[0]
    assert [own.hosts[i] for i in own.src] == [f.src for f in flows]
    position = {f.id: i for i, f in enumerate(flows)}
    assert [sorted(own.waits_for(i).tolist())
            for i in range(len(flows))] == [sorted(position[d] for d in f.after) for f in flows]
    # What the control proxy sizes circuits by, from the arrays: the same list.
    assert all(arrays.pairs(i) == p.pairs() for i, p in enumerate(sched.phases))

    def times(name, shared):
        fab, _, _, sched_here = _setup(name)
        runner = ModelIterationRunner(fab, sched_here if shared is None else sched,
                                      lambda g: scale.emu_mbps(g) * 1e6, calibration.IDEAL,
                                      tdf=scale.tdf, log=lambda _m: None, arrays=shared)
        runner.run(2)
        return [(p.name, p.start, p.end) for it in runner.iterations for p in it.phases]

    for name in ("fattree", "rfabric"):      # one schedule: both have the same hosts
        assert times(name, arrays) == times(name, None)
