"""The rotor experiment's pure parts (slot length, the ring of flows, the
scenario check, the analysis of one run), its plots, and the OCS-port
columns of ocs_reconfig's rows.

The analysis is fed captures made up here, with packets only in the lit part
of every slot, so the numbers it must give are known: goodput against the
duty-cycle bound, and a fold over the slot whose guard bins are empty.
"""

import json
import math

import pytest

from emu import scenario as scenarios
from emu.experiments import ocs_reconfig, rotor
from emu.report import rotor_plots
from emu.schema import ScenarioError
from topologies import registry
from traffic.measure.pcap import PacketRecord
from traffic.results import FlowResult

PNG = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ set-up
@pytest.mark.parametrize("guard_us, duty, slot", [
    (10.0, 0.9, 100.0), (10.0, 0.75, 40.0), (10.0, 0.5, 20.0), (2.5, 0.0, 2.5)])
def test_a_slot_is_the_guard_over_the_dark_share(guard_us, duty, slot):
    assert rotor.slot_us(guard_us, duty) == pytest.approx(slot)
    assert (rotor.slot_us(guard_us, duty) - guard_us) / rotor.slot_us(guard_us, duty) == \
        pytest.approx(duty), "the lit share of the slot is the duty cycle"


def test_ring_flows_send_from_every_tor_to_the_next_and_close_the_ring():
    fabric = registry.build("rotor,tors=4")
    flows = rotor.ring_flows(fabric)
    assert flows == [("h1", "h2"), ("h2", "h3"), ("h3", "h4"), ("h4", "h1")]
    sources, destinations = [s for s, _ in flows], [d for _, d in flows]
    assert sorted(sources) == sorted(destinations) == sorted(fabric.hosts), \
        "every host sends one flow and receives one"
    for src, dst in flows:
        assert fabric.host_port(src)[0] != fabric.host_port(dst)[0], "across ToRs: over a rotor"


def test_ring_flows_take_each_tors_first_host_only():
    fabric = registry.build("rotor,tors=4,hosts_per_tor=2")
    flows = rotor.ring_flows(fabric)
    assert len(flows) == 4
    tors = [fabric.host_port(src)[0] for src, _ in flows]
    assert tors == ["s1", "s2", "s3", "s4"]
    for src, _ in flows:
        tor = fabric.host_port(src)[0]
        on_tor = [h for h in fabric.hosts if fabric.host_port(h)[0] == tor]
        assert src == on_tor[0]


def test_the_scenario_as_shipped_passes_its_check():
    loaded = scenarios.load("rotor")
    assert loaded.experiment.kind == "rotor"
    assert loaded.config["testbed"]["panel"] == "bpf"


@pytest.mark.parametrize("overrides, message", [
    (["fabric.spec=hybrid,tors=2"], r"rotor needs the 'rotor' fabric \(got 'hybrid'\)"),
    (["rotor.duty_cycles=0.5,1.0"], r"rotor\.duty_cycles: 1\.0 must be in \(0, 1\)"),
    (["rotor.duty_cycles=0"], r"rotor\.duty_cycles: 0\.0 must be in \(0, 1\)"),
    (["testbed.panel=mirred"], r"rotor needs testbed\.panel 'bpf' or 'auto'"),
])
def test_check_refuses_what_cannot_run_a_rotor_schedule(overrides, message):
    with pytest.raises(ScenarioError, match=message):
        scenarios.load("rotor", overrides)


def test_check_accepts_the_auto_panel():
    assert scenarios.load("rotor", ["testbed.panel=auto"]).config["testbed"]["panel"] == "auto"


# ------------------------------------------------------------------ one run's analysis
EPOCH = 1_700_000_000.0
PERIOD, GUARD = 0.1, 0.01              # emulated s: duty cycle 0.9
SLOTS = 20
SETTINGS = {"fold_bins": 10, "zoom_slots": 3}     # a bin is exactly one guard long
LINK_MBPS = 10.0
FRAME = 1000                           # bytes; one every ms while lit: 8 Mbit/s


def lit_only(port=5401):
    """A receiver's capture with a frame every ms in the lit part of each slot
    (never in a guard), each 0.5 ms past a bin boundary."""
    return [PacketRecord(ts=EPOCH + k * PERIOD + GUARD + j * 1e-3 + 0.5e-3, length=FRAME,
                         src="10.0.0.1", dst="10.0.0.2", sport=40000, dport=port, proto="tcp")
            for k in range(SLOTS) for j in range(90)]


def flow(name, goodput_mbps, retransmits):
    row = FlowResult(id=name, src="h1", dst="h2", bytes=0, step=0, group="cubic-90")
    row.goodput_mbps, row.retransmits = goodput_mbps, retransmits
    return row


SCHEDULE = {"slot_emulated_s": PERIOD, "guard_emulated_s": GUARD, "epoch": EPOCH}


def analysed(run_rows=None):
    run_rows = run_rows if run_rows is not None else [
        (flow("cubic-90-h1-h2", 6.0, 3), lit_only()), (flow("cubic-90-h2-h3", 8.0, 1), lit_only())]
    return rotor._analyse(run_rows, SCHEDULE, 0.9, "cubic", LINK_MBPS, SETTINGS)


def test_goodput_is_measured_against_the_duty_cycle_bound():
    row, _, _ = analysed()
    bound = LINK_MBPS * 1448 / 1514 * 0.9
    assert row["bound_mbps"] == pytest.approx(bound)
    assert row["goodput_mbps"] == pytest.approx(7.0) and row["goodput_min_mbps"] == 6.0
    assert row["goodput_of_bound"] == pytest.approx(7.0 / bound)
    assert row["unused_lit_share"] == pytest.approx(1 - 7.0 / bound)
    assert (row["retransmits_count"], row["flows_count"]) == (4, 2)
    assert row["slot_us_emulated"] == pytest.approx(1e5)
    assert row["guard_us_emulated"] == pytest.approx(1e4)
    assert (row["congestion"], row["duty_cycle"]) == ("cubic", 0.9)


def test_the_fold_is_empty_in_the_guard_and_at_the_lit_rate_after_it():
    _, fold, _ = analysed()
    shares = fold["share_of_link"]
    assert len(shares) == 10
    assert fold["bin_us"] == pytest.approx(1e4) and fold["guard_us_emulated"] == pytest.approx(1e4)
    assert shares[0] == 0.0, "no frame in the guard: its bin is empty"
    # 8 Mbit/s while lit, on a 10 Mbit/s link (whole slots counted: a few % high).
    assert all(share == pytest.approx(0.8, rel=0.1) for share in shares[1:]), shares


def test_the_fold_bins_by_time_since_the_slots_guard_began():
    late = [PacketRecord(r.ts + 0.05, r.length, r.src, r.dst, r.sport, r.dport, r.proto)
            for r in lit_only()]                        # the same frames half a slot later
    _, fold, _ = analysed([(flow("f", 1.0, 0), late)])
    empty = [i for i, share in enumerate(fold["share_of_link"]) if share == 0.0]
    assert empty == [5], "the empty bin moved with the frames: phase is since the epoch"


def test_a_run_without_frames_gives_an_empty_fold_and_no_timeline():
    row, fold, first = analysed([(flow("f", 0.0, 0), [])])
    assert fold["share_of_link"] == [0.0] * 10
    assert first is None and row["goodput_of_bound"] == 0.0


def test_the_timeline_shows_whole_slots_after_the_flow_settled_with_their_guards():
    _, _, first = analysed()
    settled = lit_only()[0].ts + rotor.SETTLE_S
    assert first["t0"] == pytest.approx(EPOCH + math.ceil((settled - EPOCH) / PERIOD) * PERIOD)
    guards = [(g["start"], g["end"]) for g in first["dark_windows"]]
    # Epoch seconds near 1.7e9 carry ~0.2 us of rounding: compared to a microsecond.
    assert guards == [(pytest.approx(k * PERIOD, abs=1e-6),
                       pytest.approx(k * PERIOD + GUARD, abs=1e-6)) for k in range(3)], \
        "one guard per slot shown (zoom_slots 3), at each slot's start"
    (series,) = first["series"]
    assert series["label"] == "cubic-90-h1-h2 (cubic, duty 0.9)"
    rates = [v for _, v in series["points"]]
    assert len(rates) == 30, "3 slots of 10 bins (a bin is one guard)"
    assert [i for i, v in enumerate(rates) if v == 0.0] == [0, 10, 20], "the guards' bins"
    assert all(v == pytest.approx(8.0) for i, v in enumerate(rates) if i % 10)


# ------------------------------------------------------------------ plots
def test_both_plots_are_written_for_a_rotor_result(tmp_path):
    row, fold, _ = analysed()
    other_row = dict(row, duty_cycle=0.5, goodput_of_bound=0.6)
    result = json.loads(json.dumps({"scenario": "rotor", "metrics": {
        "rotor": [row, other_row, dict(row, congestion="bbr")],
        "rotor_fold": [fold, dict(fold, congestion="bbr")]}}))     # as result.json reads back
    written = rotor_plots.write_rotor_plots(result, tmp_path)
    assert written == [tmp_path / rotor_plots.DUTY_PNG, tmp_path / rotor_plots.FOLD_PNG]
    for path in written:
        assert path.read_bytes().startswith(PNG)


@pytest.mark.parametrize("metrics", [
    {}, {"rotor": [], "rotor_fold": []},
    {"rotor": [{"congestion": "cubic", "duty_cycle": 0.9, "goodput_of_bound": None}],
     "rotor_fold": [{"congestion": "cubic", "duty_cycle": 0.9, "share_of_link": []}]},
    {"rotor": "not a list", "rotor_fold": [None, 3]},
])
def test_no_plot_for_a_result_without_rotor_metrics(tmp_path, metrics):
    assert rotor_plots.write_rotor_plots({"scenario": "x", "metrics": metrics}, tmp_path) == []
    assert list(tmp_path.iterdir()) == []
    assert rotor_plots.write_rotor_plots({"scenario": "x"}, tmp_path) == []


# ------------------------------------------------------------------ ocs_reconfig's OCS columns
def test_ocs_columns_are_absent_when_the_ocs_ports_were_not_timed():
    assert ocs_reconfig._ocs_columns(None) == {}
    assert ocs_reconfig._ocs_columns({}) == {}


def test_ocs_columns_are_none_when_the_probe_saw_no_window():
    unmeasured = {"measured": False, "edges_count": 3, "pcap": "o1-ports-1.pcap"}
    assert ocs_reconfig._ocs_columns(unmeasured) == {"ocs_dark_us": None, "ocs_error_us": None}


def test_ocs_columns_carry_the_measured_window():
    measured = {"measured": True, "dark_us": 10.4, "error_us": 0.4, "start_error_us": -1.0,
                "end_error_us": -0.6, "resolution_us": 20.0, "torn_port": "o1-eth1",
                "lit_port": "o1-eth2", "pcap": "p", "capture": {}, "sender": []}
    assert ocs_reconfig._ocs_columns(measured) == {
        "ocs_dark_us": 10.4, "ocs_error_us": 0.4, "ocs_start_error_us": -1.0,
        "ocs_end_error_us": -0.6, "ocs_resolution_us": 20.0}
