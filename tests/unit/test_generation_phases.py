"""OrchestrRL's generation step as phases: `build_phases(..., generation=step)` on a
hand-made `GenerationStep` (segments, events and moves written out), checked
against the closed forms of `traffic.phases._generation_moments`."""

import pytest

from traffic import generation
from traffic.generation import Event, GenerationStep, Move, Segment
from traffic.iterations import ready_time
from traffic.phases import GENERATION_KINDS, build_phases
from traffic.ranks import Parallelism
from traffic.scale import Scale
from traffic.workload import TABLE1, ComputeTimes, Model, RLConfig, build_iteration

MOE = Model("moe", params=1.2e9, layers=8, hidden=1024, heads=8, kv_heads=2, head_dim=128,
            experts=8, top_k=2, expert_params=6e8)
SCALE = Scale(bw_factor=1e-3, tdf=10.0)
TDF = SCALE.tdf
TRAIN = 8                      # Train ranks 0..7; Gen-local rank r is global TRAIN + r


def config():
    """16 GPUs on 2-GPU servers, one host per GPU (h1..h16): Train TP=2 x PP=2 x DP=2,
    Gen TP=4 (two servers: its fixed decode all-reduce crosses the network) x EP=2."""
    return RLConfig(model=MOE, train=Parallelism(tp=2, pp=2, dp=2),
                    gen=Parallelism(tp=4, dp=2, ep=2), gpus_per_server=2, batch_prompts=4,
                    responses_per_prompt=2, prompt_len=128, response_len=256,
                    compute=ComputeTimes(train_s=2.0, optimizer_s=0.5, gen_s=3.0))


def host(gen_rank):
    return f"h{TRAIN + gen_rank + 1}"


NARROW = [(0, 1), (2, 3), (4, 5), (6, 7)]       # TP 2: one server each
WIDE = [(0, 2, 1, 3), (4, 6, 5, 7)]             # TP 4, lane-major (merge_order)

SEG_TP2 = [Segment(0, 2, NARROW, 0.0, 1.0, 40, 8, [5e5] * 4, [16] * 4),
           Segment(1, 2, NARROW, 1.0, 0.5, 20, 8, [2e5] * 4, [16] * 4)]
WIDE_BYTES = [4e6, 2e6]
SEG_WIDE = [Segment(2, 4, WIDE, 1.5, 2.0, 60, 4, WIDE_BYTES, [16, 8]),
            Segment(3, 4, WIDE, 3.5, 1.0, 10, 1, [1e6, 0.0], [8, 0])]
# Rebalance 0 (TP 2): lane l of instance 0 -> lane l of instance 2, across servers.
REBALANCE0 = [Move(0, 4, 1000.0), Move(1, 5, 1000.0)]
# The switch: KV across servers (2 <-> 1, 3 -> 0) and one move inside server 0.
SWITCH = [Move(1, 2, 3000.0), Move(2, 1, 3000.0), Move(3, 0, 1500.0), Move(0, 1, 777.0)]
REBALANCE2 = [Move(0, 4, 500.0), Move(2, 6, 500.0), Move(1, 5, 500.0), Move(3, 7, 500.0)]
EVENTS = [Event("rebalance", 1.0, 2, 2, REBALANCE0, 0.0, 2000.0, 1),
          Event("switch", 1.5, 2, 4, SWITCH, 0.0, 8277.0, 6),
          Event("rebalance", 3.5, 4, 4, REBALANCE2, 0.0, 2000.0, 1)]
CHAIN = ["gen-migrate0", "gen-config2-tp4", "gen-migrate2", "gen-config3-tp4"]


def step():
    return GenerationStep("switch+rebalance", 8, [64] * 16, SEG_TP2 + SEG_WIDE, list(EVENTS),
                          compute_s=4.5, tokens=1024)


def schedule(generation_step="hand"):
    cfg = config()
    rank_map = cfg.rank_map([f"h{i + 1}" for i in range(cfg.world)])
    made = step() if generation_step == "hand" else generation_step
    return build_phases(build_iteration(cfg), rank_map, SCALE, generation=made), rank_map


def sent(phase, group):
    total = {}
    for f in phase.dag.flows:
        if f.group == group:
            total[f.src, f.dst] = total.get((f.src, f.dst), 0) + f.bytes
    return total


# ---------------------------------------------------------------- which phases
def test_the_hand_made_step_is_self_consistent():
    made = step()
    for k in range(1, len(made.segments)):
        before = made.segments[k - 1]
        assert made.events[k - 1].at_s == pytest.approx(before.start_s + before.compute_s)
        assert made.segments[k].start_s == made.events[k - 1].at_s
    last = made.segments[-1]
    assert made.compute_s == pytest.approx(last.start_s + last.compute_s)


def test_generation_drops_gen_tp_and_adds_the_chain():
    cfg = config()
    rank_map = cfg.rank_map([f"h{i + 1}" for i in range(cfg.world)])
    fixed = build_phases(build_iteration(cfg), rank_map, SCALE)
    assert "gen-tp" in fixed.names(), "the fixed decode's TP=4 crosses servers"
    sched, _ = schedule()
    assert "gen-tp" not in sched.names(), "the generation step's segments replace gen-tp"
    chain = [p.name for p in sched.phases if p.kind in GENERATION_KINDS]
    assert chain == CHAIN, "by planned start; no phase for the TP-2 segments"
    assert not any(n.startswith(("gen-config0", "gen-config1")) for n in sched.names()), \
        "a segment inside the servers (TP <= gpus_per_server) is compute only"
    assert {"gen-ep", "response", "weight-sync", "train-dp"} <= set(sched.names())


def test_chain_phases_have_their_kind_window_and_planned_start():
    sched, _ = schedule()
    kinds = dict(zip(CHAIN, ["gen-migrate", "gen-config", "gen-migrate", "gen-config"]))
    for name, kind in kinds.items():
        phase = sched.phase(name)
        assert phase.kind == kind
        assert phase.stage == "gen" and phase.window == TABLE1[kind].window
    assert sched.phase("gen-migrate0").window == "Small", "a rebalance rides what is lit"
    assert sched.phase("gen-config2-tp4").window == "Large"
    assert sched.phase("gen-migrate0").start_s == pytest.approx(1.0 * TDF)
    assert sched.phase("gen-config2-tp4").start_s == pytest.approx(1.5 * TDF)
    assert sched.phase("gen-migrate2").start_s == pytest.approx(3.5 * TDF)
    assert sched.phase("gen-config3-tp4").start_s == pytest.approx(3.5 * TDF)
    assert sched.phase("gen-config2-tp4").span_s == pytest.approx(2.0 * TDF)
    assert sched.phase("gen-config3-tp4").span_s == pytest.approx(1.0 * TDF)
    assert sched.phase("gen-migrate0").span_s == 0.0


# ---------------------------------------------------------------- a configuration's DAG
def test_a_switch_configuration_starts_with_the_moves_then_decodes():
    sched, _ = schedule()
    phase = sched.phase("gen-config2-tp4")
    groups = [f.group for f in phase.dag.flows]
    assert set(groups) == {"gen-switch", "gen-config"}
    first_decode = groups.index("gen-config")
    assert set(groups[:first_decode]) == {"gen-switch"} and \
        set(groups[first_decode:]) == {"gen-config"}, "the DAG starts with the switch's moves"
    moves = [f for f in phase.dag.flows if f.group == "gen-switch"]
    assert all(f.after == () and f.at_s == 0.0 for f in moves), "moves go at the phase start"
    ids = {f.id for f in moves}
    decode = [f for f in phase.dag.flows if f.group == "gen-config"]
    assert decode and all(set(f.after) == ids for f in decode), \
        "nothing decodes before the switch's KV and shards are in place"
    assert not phase.dag.external, "the moves it waits for are inside the phase"


def test_switch_moves_are_the_events_across_servers_in_emulated_bytes():
    sched, _ = schedule()
    phase = sched.phase("gen-config2-tp4")
    expected = {(host(m.src), host(m.dst)): SCALE.emu_bytes(m.bytes)
                for m in SWITCH if m.src // 2 != m.dst // 2}
    assert sent(phase, "gen-switch") == expected, "the move inside server 0 is not replayed"


def test_decode_bytes_are_each_ranks_ring_share_of_the_segment_tp_bytes():
    sched, _ = schedule()
    phase = sched.phase("gen-config2-tp4")
    n = 4
    expected = {}
    for instance, tp_bytes in zip(WIDE, WIDE_BYTES):
        ring = sorted(instance)        # server by server, as NCCL rings go
        for i, rank in enumerate(ring):
            nxt = ring[(i + 1) % n]
            if rank // 2 != nxt // 2:  # the hops inside a server stay off the network
                expected[host(rank), host(nxt)] = 2 * (n - 1) / n * tp_bytes
    decode = sent(phase, "gen-config")
    assert set(decode) == set(expected), "one flow per ring neighbour on another server"
    assert len(decode) == 2 * len(WIDE), "a ring over two servers crosses twice"
    for pair, real in expected.items():
        assert decode[pair] == pytest.approx(SCALE.emu_bytes(real), abs=1), pair
    switch_real = sum(m.bytes for m in SWITCH if m.src // 2 != m.dst // 2)
    assert phase.real_bytes == pytest.approx(switch_real + sum(expected.values()))
    assert phase.ops_real == 16, "the busiest instance's 2L x steps"


def test_a_configuration_without_a_switch_has_only_its_decode():
    sched, _ = schedule()
    phase = sched.phase("gen-config3-tp4")
    assert {f.group for f in phase.dag.flows} == {"gen-config"}
    assert all(f.after == () for f in phase.dag.flows)
    pairs = {(f.src, f.dst) for f in phase.dag.flows}
    # Instance 0 is GPUs 0-3 (servers 0 and 1): its ring 0 1 2 3 crosses at 1 -> 2
    # and 3 -> 0; instance 1 decoded nothing in segment 3.
    assert pairs == {(host(1), host(2)), (host(3), host(0))}
    for f in phase.dag.flows:
        assert f.bytes == pytest.approx(SCALE.emu_bytes(2 * 3 / 4 * 1e6), abs=1)
    assert phase.real_bytes == pytest.approx(2 * 2 * 3 / 4 * 1e6)


def test_a_rebalance_is_a_migrate_phase_of_its_kv_moves():
    sched, _ = schedule()
    phase = sched.phase("gen-migrate0")
    assert phase.kind == "gen-migrate" and phase.window == "Small"
    assert {f.group for f in phase.dag.flows} == {"gen-migrate"}
    assert sent(phase, "gen-migrate") == {(host(m.src), host(m.dst)): SCALE.emu_bytes(m.bytes)
                                          for m in REBALANCE0}
    assert phase.real_bytes == pytest.approx(sum(m.bytes for m in REBALANCE0))
    late = sched.phase("gen-migrate2")
    assert late.real_bytes == pytest.approx(sum(m.bytes for m in REBALANCE2))


def test_a_rebalance_inside_the_servers_is_no_phase():
    made = step()
    made.events[0] = Event("rebalance", 1.0, 2, 2, [Move(0, 1, 1000.0), Move(5, 4, 9.0)],
                           0.0, 1009.0, 1)
    sched, _ = schedule(made)
    chain = [p.name for p in sched.phases if p.kind in GENERATION_KINDS]
    assert chain == CHAIN[1:]
    first = sched.phase("gen-config2-tp4")
    assert first.after == () and first.gaps == (), "the chain starts at its first moment"


# ---------------------------------------------------------------- the chain in time
def test_each_chain_phase_waits_for_the_previous_and_owes_the_compute_between():
    sched, _ = schedule()
    phases = [sched.phase(n) for n in CHAIN]
    assert phases[0].after == () and phases[0].gaps == ()
    # Planned compute from one moment's start to the next (segment starts x tdf).
    owed = {"gen-config2-tp4": (1.5 - 1.0) * TDF, "gen-migrate2": (3.5 - 1.5) * TDF,
            "gen-config3-tp4": 0.0}
    for before, phase in zip(phases, phases[1:]):
        assert phase.after == (before.name,)
        (gap,) = phase.gaps
        assert gap[0] == before.name
        assert gap[1] == pytest.approx(owed[phase.name]), phase.name
        assert gap[1] == pytest.approx(phase.start_s - before.start_s)


def test_the_weight_sync_owes_the_compute_after_the_last_moment():
    made = step()
    sched, _ = schedule()
    sync = sched.phase("weight-sync")
    assert set(CHAIN) <= set(sync.after)
    assert sync.gaps == (("gen-config3-tp4", pytest.approx((4.5 - 3.5) * TDF)),)
    assert sync.start_s >= SCALE.emu_seconds(made.compute_s)


def test_the_gen_side_spans_the_generation_steps_compute():
    cfg = config()
    made = step()
    sched, _ = schedule()
    span = SCALE.emu_seconds(made.compute_s)
    assert span != SCALE.emu_seconds(cfg.compute.gen_s), "the fixed gen_s would differ"
    assert sched.phase("gen-ep").span_s == pytest.approx(span)
    assert sched.phase("response").span_s == pytest.approx(span)
    assert sched.phase("train-pp").span_s == pytest.approx(SCALE.emu_seconds(cfg.compute.train_s))


def _replay(sched, durations, t0=100.0):
    """Ready times from `ready_time` with each phase ending ``durations[name]`` after
    it is ready (0 when not given), in an order where dependencies end first."""
    ends, ready = {}, {}
    todo = list(sched.phases)
    while todo:
        phase = next(p for p in todo if all(a in ends for a in p.after))
        todo.remove(phase)
        ready[phase.name] = ready_time(phase, t0, ends, SCALE.emu_seconds(0.5))
        ends[phase.name] = ready[phase.name] + durations.get(phase.name, 0.0)
    return ready


def test_with_an_instant_network_the_chain_keeps_its_planned_times():
    sched, _ = schedule()
    ready = _replay(sched, {})
    for name in CHAIN:
        assert ready[name] == pytest.approx(100.0 + sched.phase(name).start_s), name


def test_a_slow_moment_delays_every_later_one_by_exactly_its_delay():
    sched, _ = schedule()
    base = {name: 0.01 for name in CHAIN}
    before = _replay(sched, base)
    for slow, delay in (("gen-migrate0", 7.0), ("gen-config2-tp4", 3.25)):
        after = _replay(sched, dict(base, **{slow: base[slow] + delay}))
        later = CHAIN[CHAIN.index(slow) + 1:]
        for name in CHAIN[:CHAIN.index(slow) + 1]:
            assert after[name] == pytest.approx(before[name]), f"{name} is before {slow}"
        for name in later:
            assert after[name] - before[name] == pytest.approx(delay), \
                f"{slow} {delay} s slower moves {name} by as much"
        assert after["weight-sync"] - before["weight-sync"] == pytest.approx(delay), \
            "the weight sync waits for the decode after the last moment"


# ---------------------------------------------------------------- from simulate
def test_a_simulated_switch_becomes_one_configuration_phase():
    made = generation.simulate(8, 16, "switch", generation.PolicyParams(
        tp=2, switch_tp=4, switch_below=0.25, rebalance_every=64, imbalance=1.5,
        max_rebalances=0), generation.DecodeModel(), generation.LengthDist(), MOE, seed=3,
        prompt_len=128)
    (event,) = made.events
    assert event.kind == "switch"
    sched, rank_map = schedule(made)
    (phase,) = [p for p in sched.phases if p.kind in GENERATION_KINDS]
    assert phase.name == "gen-config1-tp4"
    assert phase.start_s == pytest.approx(SCALE.emu_seconds(event.at_s))
    seg = made.segments[1]
    assert seg.tp == 4 and all(b > 0 for b in seg.tp_bytes)
    switch = sum(m.bytes for m in event.moves
                 if rank_map.on_network(TRAIN + m.src, TRAIN + m.dst))
    assert switch > 0, "the merged instances' KV crosses servers"
    # Each TP-4 instance spans two servers: its ring crosses twice.
    expected = switch + sum(2 * 2 * 3 / 4 * b for b in seg.tp_bytes)
    assert phase.real_bytes == pytest.approx(expected)
    assert sched.phase("weight-sync").gaps == (
        (phase.name, pytest.approx(SCALE.emu_seconds(made.compute_s - seg.start_s))),)
