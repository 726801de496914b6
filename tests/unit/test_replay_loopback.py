"""The replay engine with real iperf3 processes on loopback addresses (no root).

A fake testbed runs every "host" process in this namespace and gives each
host its own 127.0.0.x address, so the agents, one-off servers, reverse-mode
clients, dependencies, gates and callbacks are all exercised for real.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from loopback_bed import LoopbackBed, owned_processes  # noqa: F401  (an autouse fixture)

from traffic.flows import Flow, FlowDag
from emu.live import replay
from traffic.ports import CLIENT_PORTS, SERVER_PORTS, PortBook
from emu.live.agents import AgentPool
from emu.live.replay import Replayer

pytestmark = pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs iperf3")
def test_dag_order_bytes_and_receiver_side_end(tmp_path):
    bed = LoopbackBed(["a", "b", "c"])
    dag = FlowDag([Flow("f1", "a", "b", 200_000),
                   Flow("f2", "b", "c", 100_000, after=("f1",)),
                   Flow("f3", "a", "c", 50_000, at_s=0.3)])
    replayer = Replayer(bed, dag, 1000.0, tmp_path / "flows")
    results = {r.id: r for r in replayer.run()}
    assert all(r.status == "ok" for r in results.values()), results
    for flow in dag.flows:
        assert results[flow.id].bytes_received >= flow.bytes, results[flow.id]
    assert results["f2"].start >= results["f1"].end, "f2 must wait for f1's end"
    # Due 0.3 s after the replay's start (not after f1's, which waits for its server).
    assert results["f3"].start >= replayer.t0 + 0.3
    # Reverse mode: the sender is the one-off server on the flow's source
    # host; both ports are the ones the seed draws for the flow, in plan order.
    book = PortBook(bed.ecmp_seed)
    for flow in dag.topological_order():
        row = results[flow.id]
        assert (row.sport, row.dport) == (book.server(flow.src, flow.id),
                                          book.client(flow.dst, flow.id)), row
        assert row.sport in SERVER_PORTS and row.dport in CLIENT_PORTS, row


def test_a_seed_draws_every_flows_ports_and_seed_0_leaves_clients_to_the_kernel(tmp_path):
    dag = FlowDag([Flow("f1", "a", "b", 50_000), Flow("f2", "b", "a", 50_000, at_s=0.1)])

    def ports(seed):
        results = Replayer(LoopbackBed(["a", "b"], ecmp_seed=seed), dag, 1000.0,
                           tmp_path / str(seed)).run()
        assert all(r.status == "ok" for r in results), results
        return [(r.sport, r.dport) for r in results]

    # (Not the same seed twice here: on the testbed hosts keep no TIME_WAIT,
    # which a client that closed first would hold on its port for 60 s.)
    book, seven = PortBook(7), ports(7)
    assert seven == [(book.server("a", "f1"), book.client("b", "f1")),
                     (book.server("b", "f2"), book.client("a", "f2"))]
    assert ports(8) != seven
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(sport in SERVER_PORTS and dport >= low for sport, dport in ports(0))



def test_a_window_reaches_every_flows_sockets_moved_ones_too(tmp_path):
    bed = LoopbackBed(["a", "b", "c"])
    dag = FlowDag([Flow("f1", "a", "b", 100_000), Flow("f2", "a", "c", 100_000, at_s=0.5)])
    replayer = Replayer(bed, dag, 1000.0, tmp_path / "flows", window_bytes=14480,
                        events=[(0.0, lambda player: player.move("f2", src="b"))])
    results = {r.id: r for r in replayer.run()}
    sent = [r for r in results.values() if r.status == "ok"]
    assert [r.id for r in sent] == ["f1", "f2~m1"], results
    assert [r.window_bytes for r in sent] == [14480, 14480], results
    plain = Replayer(LoopbackBed(["a", "b"]), FlowDag([Flow("f", "a", "b", 100_000)]), 1000.0,
                     tmp_path / "plain").run()
    assert plain[0].window_bytes == 0

def test_gate_holds_flows_until_on_done_releases_credit(tmp_path):
    bed = LoopbackBed(["p1", "p2", "p3", "d"])
    running, peak, log = set(), [0], []

    def gate(flow):
        if len(running) >= 1:          # one stream into d at a time
            return False
        running.add(flow.id)
        peak[0] = max(peak[0], len(running))
        return True

    def on_done(result):
        running.discard(result.id)
        log.append(result.id)
        told.append(("done", result.id))

    told = []       # what the hooks heard, in order
    dag = FlowDag([Flow(f"kv{i}", f"p{i}", "d", 300_000) for i in (1, 2, 3)])
    started = time.time()
    results = Replayer(bed, dag, 1000.0, tmp_path / "flows", gate=gate, on_done=on_done,
                       on_start=lambda flow: told.append(("start", flow.id))).run()
    assert all(r.status == "ok" for r in results), results
    assert peak[0] == 1 and sorted(log) == ["kv1", "kv2", "kv3"]
    # One stream at a time: each flow is told started once, then done, then the next.
    assert told == [(event, fid) for fid in log for event in ("start", "done")], told
    spans = sorted((r.start, r.end) for r in results)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end - 0.05, f"gated flows overlapped: {spans}"
    assert time.time() - started < 60


def test_event_moves_a_running_flow_and_an_unarmed_one_to_other_hosts(tmp_path):
    bed = LoopbackBed(["a", "a2", "b", "c"])
    finished = []
    moves = {}

    def fail_a(replayer):
        moves["running"] = replayer.move("slow", src="a2")
        moves["later"] = replayer.move("later", src="a2")
        moves["done"] = replayer.move("quick", src="a2")

    dag = FlowDag([Flow("quick", "a", "c", 20_000),
                   Flow("slow", "a", "b", 2_000_000, rate_mbps=16.0),
                   Flow("after-slow", "b", "c", 20_000, after=("slow",)),
                   Flow("later", "a", "c", 20_000, at_s=3.0)])
    told = []
    replayer = Replayer(bed, dag, 1000.0, tmp_path / "flows", on_done=finished.append,
                        events=[(0.4, fail_a)], agent_hosts=["a2"],
                        on_moved=lambda old, new: told.append((old, new)))
    results = {r.id: r for r in replayer.run()}
    assert moves == {"running": "slow~m1", "later": "later", "done": None}
    assert told == [("slow", "slow~m1")], "only a cancelled-and-resent flow is reported moved"
    assert results["slow"].status == "moved" and "slow~m1" in results["slow"].error
    assert results["slow~m1"].status == "ok" and results["slow~m1"].src == "a2"
    assert results["slow~m1"].bytes_received >= 2_000_000, "a moved flow resends every byte"
    assert results["slow~m1"].start >= results["slow"].end - 0.01
    assert results["after-slow"].start >= results["slow~m1"].end, \
        "a flow that waited for the moved one waits for its replacement"
    assert results["later"].status == "ok" and results["later"].src == "a2"
    assert results["quick"].src == "a", "a finished flow is not moved"
    assert "slow" not in {r.id for r in finished}, "a moved flow must not be reported done"
    assert sorted(r.id for r in finished) == ["after-slow", "later", "quick", "slow~m1"]



def test_a_move_keeps_an_armed_flows_due_time_and_resends_a_running_one_now(tmp_path):
    """A failure must not make a later transfer due early: an armed flow that
    has not started keeps its time (and its place in the gate's queue)."""
    bed = LoopbackBed(["a", "a2", "b"])
    moved = {}

    def fail_a(replayer):
        moved["running"] = (replayer.started("slow"), replayer.move("slow", src="a2"))
        moved["armed"] = (replayer.started("due"), replayer.move("due", src="a2"))
        # The resent one's server is starting already; the one due later waits
        # for the loop to arm it, and nothing was started to end the old ones.
        moved["armed at once"] = sorted(f for f in ("slow~m1", "due~m1")
                                        if f in replayer._armed)
        moved["ss started in the callback"] = any(args[0] == "ss" for _, args in bed.started)

    dag = FlowDag([Flow("slow", "a", "b", 2_000_000, rate_mbps=16.0),
                   Flow("due", "a", "b", 20_000, at_s=1.5)])
    replayer = Replayer(bed, dag, 1000.0, tmp_path / "flows", events=[(0.4, fail_a)],
                        agent_hosts=["a2"])
    results = {r.id: r for r in replayer.run()}
    assert moved == {"running": (True, "slow~m1"), "armed": (False, "due~m1"),
                     "armed at once": ["slow~m1"], "ss started in the callback": False}
    # The running one's connections are destroyed at both ends (behind a
    # failed port they would linger with its four-tuple); the armed one had none.
    server = f"127.0.0.2:{PortBook(bed.ecmp_seed).server('a', 'slow')}"
    assert [(host, args) for host, args in bed.started if args[0] == "ss"] == \
        [("a", ["ss", "-K", "-t", "-n", "src", server]),
         ("b", ["ss", "-K", "-t", "-n", "dst", server])]
    assert results["due"].status == "moved" and results["due~m1"].status == "ok"
    assert results["due~m1"].start >= replayer.t0 + 1.5, "it stays due at 1.5 s"
    assert results["slow~m1"].start < replayer.t0 + 1.0, "the running one restarts at once"
    assert list(results)[:4] == ["slow", "slow~m1", "due", "due~m1"], \
        "a replacement sits beside the flow it replaces"

def test_a_resend_on_standby_starts_from_processes_armed_before_the_clock(tmp_path):
    """`standby`: each named resend's server listens and its client waits from
    before the clock; a move to those hosts starts no process, a move
    elsewhere drops the standby for processes of its own, and unused ones go."""
    bed = LoopbackBed(["a", "a2", "a3", "b", "c"])
    seen = {}

    def fail_a(replayer):
        seen["started before"] = len(bed.started)
        seen["moved"] = (replayer.move("slow", src="a2"), replayer.move("other", src="a3"))
        seen["servers in the callback"] = [host for host, args in
                                           bed.started[seen["started before"]:]
                                           if "--server" in args]

    dag = FlowDag([Flow("slow", "a", "b", 2_000_000, rate_mbps=16.0),
                   Flow("other", "a", "c", 2_000_000, rate_mbps=16.0),
                   Flow("later", "a", "c", 20_000, at_s=3.0)])
    replayer = Replayer(bed, dag, 1000.0, tmp_path / "flows", events=[(0.4, fail_a)],
                        agent_hosts=["a2", "a3"],
                        standby=lambda flow: ("a2", flow.dst) if flow.src == "a" else None)
    replayer.prepare()
    standbys = {fid: replayer._servers[fid + replay.STANDBY_SUFFIX]
                for fid in ("slow~m1", "other~m1", "later~m1")}
    assert {fid + replay.STANDBY_SUFFIX for fid in standbys} <= replayer._listening, \
        "standby servers listen before the clock"
    results = {r.id: r for r in replayer.run()}
    assert seen["moved"] == ("slow~m1", "other~m1")
    assert seen["servers in the callback"] == ["a3"], \
        "a resend on standby starts no server; one moved elsewhere does"
    assert results["slow~m1"].status == "ok" and results["slow~m1"].src == "a2"
    assert results["slow~m1"].bytes_received >= 2_000_000
    # Its ports were taken after every planned flow's, for the id a first move gives.
    book = PortBook(bed.ecmp_seed)
    for flow in dag.topological_order():
        book.server(flow.src, flow.id), book.client(flow.dst, flow.id)
    assert (results["slow~m1"].sport, results["slow~m1"].dport) == \
        (book.server("a2", "slow~m1"), book.client("b", "slow~m1"))
    assert results["other~m1"].status == "ok" and results["other~m1"].src == "a3", \
        "a move elsewhere than the standby's hosts gets processes of its own"
    assert results["later"].status == "ok" and results["later"].src == "a", "not moved"
    assert set(results) == {"slow", "slow~m1", "other", "other~m1", "later"}, \
        "a standby left unused or dropped is no flow of the replay"
    assert all(server.poll() is not None for server in standbys.values())
    assert all(agent.proc.poll() is not None for agent in replayer._agents.values())


def test_a_flow_after_a_pause_is_armed_only_when_near_due(tmp_path, monkeypatch):
    """The next step of a collective is armed while its predecessor runs; the
    next phase, after a pause, only once the flows it follows have ended and
    its time is near, so its processes never start beside busy senders."""
    monkeypatch.setattr(replay, "ARM_AHEAD_S", 0.4)
    bed = LoopbackBed(["a", "b", "c"])
    dag = FlowDag([Flow("f1", "a", "b", 2_000_000),
                   Flow("step", "b", "c", 100_000, after=("f1",)),
                   Flow("phase", "c", "a", 100_000, after=("f1",), at_s=1.0)])
    player = Replayer(bed, dag, 1000.0, tmp_path / "flows")
    armed_at = {}
    arm = player._arm

    def record(fid):
        armed_at[fid] = time.time()
        arm(fid)

    player._arm = record
    results = {r.id: r for r in player.run()}
    assert all(r.status == "ok" for r in results.values()), results
    assert armed_at["step"] < results["f1"].end, "the next step is armed while f1 runs"
    assert armed_at["phase"] >= results["f1"].end + 1.0 - 0.4 - 0.05, (armed_at, results["f1"])
    assert results["phase"].start >= results["f1"].end + 1.0


def test_arm_time_of_each_kind_of_flow():
    player = Replayer(LoopbackBed(["a", "b"]), FlowDag([]), 10.0, Path("/nonexistent"))
    player.t0 = 100.0
    ahead = replay.ARM_AHEAD_S
    assert player._arm_at(Flow("t", "a", "b", 1, at_s=5.0)) == 100.0 + 5.0 - ahead
    step = Flow("s", "a", "b", 1, after=("d",))
    pause = Flow("p", "a", "b", 1, after=("d",), at_s=ahead + 3.0)
    assert player._arm_at(step) is None and player._arm_at(pause) is None
    player._fired["d"] = 101.0
    assert player._arm_at(step) is not None and player._arm_at(pause) is None
    player._done.add("d")
    player.results["d"] = SimpleNamespace(end=102.0)
    assert player._arm_at(pause) == 102.0 + 3.0


def test_a_posted_callback_runs_in_the_loop_while_flows_go_on(tmp_path):
    """An event that waits elsewhere (a controller rerouting) does not hold the
    loop: flows due meanwhile start, and its follow-up runs when posted."""
    import threading
    bed = LoopbackBed(["a", "a2", "b", "c"])
    release = threading.Event()
    ran = {}

    def fail_a(replayer):
        def follow_up(loop):
            ran["loop"] = loop
            ran["moved"] = loop.move("slow", src="a2")
        threading.Thread(target=lambda: (release.wait(10), replayer.post(follow_up)),
                         daemon=True).start()

    def on_done(result):
        if result.id == "due-meanwhile":
            release.set()   # the follow-up is posted only once this flow ended

    dag = FlowDag([Flow("slow", "a", "b", 2_000_000, rate_mbps=16.0),
                   Flow("due-meanwhile", "a", "c", 20_000, at_s=0.6)])
    replayer = Replayer(bed, dag, 1000.0, tmp_path / "flows", events=[(0.3, fail_a)],
                        agent_hosts=["a2"], on_done=on_done)
    results = {r.id: r for r in replayer.run()}
    assert ran["loop"] is replayer and ran["moved"] == "slow~m1"
    assert results["due-meanwhile"].status == "ok"
    assert results["slow~m1"].status == "ok" and results["slow~m1"].src == "a2"
    assert results["slow~m1"].start >= results["due-meanwhile"].end - 0.01, \
        "the follow-up ran after a flow that started while it was pending"


class OneStreamGate:
    """A gate that lets one flow go at a time (one stream into a D), and notes
    the order it was first asked about each flow."""

    def __init__(self):
        self.asked, self.holder = [], None

    def __call__(self, flow) -> bool:
        if flow.id not in self.asked:
            self.asked.append(flow.id)
        if self.holder not in (None, flow.id):
            return False
        self.holder = flow.id
        return True

    def done(self, _result) -> None:
        self.holder = None


def test_the_gate_hears_of_flows_in_the_order_they_are_due_not_as_servers_start(
        tmp_path, monkeypatch):
    """A flow whose server comes up late keeps its place in the credit queue."""
    import threading
    real_start = replay.start_server

    def late_for_first(bed, host, ip, port, name, on_ready):
        if name == "first":   # its server is slow to listen: 0.6 s late
            return real_start(bed, host, ip, port, name,
                              lambda: threading.Timer(0.6, on_ready).start())
        return real_start(bed, host, ip, port, name, on_ready)

    monkeypatch.setattr(replay, "start_server", late_for_first)
    bed = LoopbackBed(["p1", "p2", "d"])
    gate = OneStreamGate()

    dag = FlowDag([Flow("first", "p1", "d", 100_000, at_s=0.1),
                   Flow("second", "p2", "d", 100_000, at_s=0.2)])
    results = {r.id: r for r in Replayer(bed, dag, 1000.0, tmp_path / "flows", gate=gate,
                                         on_done=gate.done).run()}
    assert all(r.status == "ok" for r in results.values()), results
    assert gate.asked[0] == "first", f"the gate was asked {gate.asked}"
    assert results["second"].start >= results["first"].end - 0.05, \
        "the flow due first got the credit although its server listened later"


def test_flows_found_due_together_reach_the_gate_in_the_order_they_came_due(tmp_path):
    """A loop held up (here by an event callback, as moving flows off a failed
    port holds it) finds several flows due at once: the credit queue still
    gets them by due time, not in plan order."""
    bed = LoopbackBed(["p1", "p2", "d"])
    gate = OneStreamGate()

    # Planned first but due last, so that plan order and due order differ.
    dag = FlowDag([Flow("due-later", "p1", "d", 100_000, at_s=0.35),
                   Flow("due-first", "p2", "d", 100_000, at_s=0.30)])
    busy = [(0.25, lambda _replayer: time.sleep(0.3))]
    results = {r.id: r for r in Replayer(bed, dag, 1000.0, tmp_path / "flows", gate=gate,
                                         on_done=gate.done,
                                         events=busy).run()}
    assert all(r.status == "ok" for r in results.values()), results
    assert gate.asked == ["due-first", "due-later"], f"the gate was asked {gate.asked}"
    assert results["due-later"].start >= results["due-first"].end - 0.05


def test_the_clock_starts_once_the_first_waves_processes_are_ready(tmp_path):
    """Helper processes starting together must not delay the first flows: the
    flows due within ARM_AHEAD_S are armed, and listening, before t0."""
    bed = LoopbackBed(["a", "b", "c"])
    dag = FlowDag([Flow("now", "a", "b", 20_000), Flow("soon", "b", "c", 20_000, at_s=0.5),
                   Flow("later", "c", "a", 20_000, at_s=2.5),
                   Flow("next", "a", "c", 20_000, after=("now",))])
    player = Replayer(bed, dag, 1000.0, tmp_path / "flows")
    armed_at, listening_at_t0 = {}, []
    arm, first_wave = player._arm, player._arm_first_wave

    def record(fid):
        armed_at[fid] = time.time()
        arm(fid)

    def wave():
        first_wave()
        listening_at_t0.extend(sorted(player._listening))

    player._arm, player._arm_first_wave = record, wave
    results = {r.id: r for r in player.run()}
    assert all(r.status == "ok" for r in results.values()), results
    assert listening_at_t0 == ["now", "soon"]
    assert max(armed_at["now"], armed_at["soon"]) < player.t0 < armed_at["later"]
    assert armed_at["next"] > player.t0, "a flow that follows others is not in the first wave"


def _agents_started(bed):
    return [host for host, args in bed.started if "emu.live.host_agent" in args]


def test_replays_sharing_an_agent_pool_start_each_agent_once_and_get_their_own_results(
        tmp_path):
    import threading

    bed = LoopbackBed(["a", "b", "c"])
    pool = AgentPool(bed, tmp_path / "agents")
    # Two replays side by side with the same flow ids (one phase of two
    # iterations), then a third after them: every result goes to its replay.
    dags = {"one": FlowDag([Flow("f", "a", "b", 200_000), Flow("g", "a", "c", 100_000)]),
            "two": FlowDag([Flow("f", "c", "b", 100_000), Flow("g", "b", "c", 50_000)])}
    results, finished = {}, {}

    def replay_one(name):
        replayer = Replayer(bed, dags[name], 1000.0, tmp_path / name, agents=pool,
                            port_key=f"{name}/")
        results[name] = {r.id: r for r in replayer.run()}
        finished[name] = replayer.finished_at

    try:
        threads = [threading.Thread(target=replay_one, args=(name,)) for name in dags]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        replay_one("one")
        for name, dag in dags.items():
            for flow in dag.flows:
                row = results[name][flow.id]
                assert row.status == "ok", row
                assert (row.src, row.dst, row.bytes_received) == (flow.src, flow.dst,
                                                                  flow.bytes), row
                assert (tmp_path / name / f"{flow.id}.json").is_file()
            assert finished[name] >= max(r.end for r in results[name].values())
        # One agent per receiving host for all three replays, still running.
        assert sorted(_agents_started(bed)) == ["b", "c"]
        agents = list(pool._agents.values())
        assert all(agent.proc.poll() is None for agent in agents)
    finally:
        pool.close()
    assert all(agent.proc.poll() is not None for agent in agents)


def test_a_replay_without_a_pool_stops_its_own_agents(tmp_path):
    bed = LoopbackBed(["a", "b"])
    replayer = Replayer(bed, FlowDag([Flow("f", "a", "b", 50_000)]), 1000.0, tmp_path / "f")
    assert replayer.run()[0].status == "ok"
    assert _agents_started(bed) == ["b"]
    assert all(agent.proc.poll() is not None for agent in replayer._agents.values())


def test_a_prepared_replay_has_its_first_flows_armed_before_it_runs(tmp_path):
    bed = LoopbackBed(["a", "b"])
    pool = AgentPool(bed, tmp_path / "agents")
    try:
        replayer = Replayer(bed, FlowDag([Flow("f", "a", "b", 50_000),
                                          Flow("g", "b", "a", 50_000, after=("f",))]),
                            1000.0, tmp_path / "r", agents=pool)
        replayer.prepare()
        assert replayer._armed == {"f"} and replayer._listening == {"f"}
        assert replayer.t0 == 0.0, "the clock starts with run(), not prepare()"
        servers = len([1 for _, args in bed.started if "--server" in args])
        before = time.time()
        results = {r.id: r for r in replayer.run()}
        assert all(r.status == "ok" for r in results.values()), results
        assert replayer.t0 >= before
        assert len([1 for _, args in bed.started if "--server" in args]) == servers + 1
        replayer.close()            # again: nothing left to stop
    finally:
        pool.close()


def test_a_prepared_replay_that_never_runs_leaves_nothing_behind(tmp_path):
    bed = LoopbackBed(["a", "b"])
    replayer = Replayer(bed, FlowDag([Flow("f", "a", "b", 50_000)]), 1000.0, tmp_path / "r")
    replayer.prepare()
    server = replayer._servers["f"]
    assert server.poll() is None
    replayer.close()
    assert server.poll() is not None
    assert all(agent.proc.poll() is not None for agent in replayer._agents.values())
