"""Tests for emu.live.loadlog: link load from port counters, sampled into load.csv."""

import csv

import pytest

from controllers.control import ControlError
from emu.live.loadlog import LOAD_COLUMNS, LoadSampler, link_rates, sent_bytes, wired_ports
from emu.live.waiting import wait_until
from emu.report.load import LOAD_COLUMNS as REPORT_LOAD_COLUMNS
from topologies.fabric import Fabric

# A sampler whose thread never reaches its first deadline: the tests take
# every sample by hand, at the fake clock's times.
NEVER_S = 3600.0
# Rows per sample of the line fabric: both directions of its three links.
DIRECTIONS = 6


def line_fabric():
    """h1 - s1 - s2 - h2.  s1: port 1 -> h1, port 2 -> s2; s2: port 1 -> s1, port 2 -> h2."""
    fabric = Fabric("line")
    h1, h2 = fabric.add_host(), fabric.add_host()
    s1, s2 = fabric.add_switch("leaf"), fabric.add_switch("leaf")
    fabric.add_link(h1, s1, gbps=100)
    fabric.add_link(s1, s2, gbps=100)
    fabric.add_link(s2, h2, gbps=100)
    return fabric


class FakeSwitches:
    """Port counters set by the test, read as `Testbed.counters` returns them."""

    def __init__(self):
        self.sent = {"s1": {1: 0, 2: 0}, "s2": {1: 0, 2: 0}}
        self.received = {"s1": {1: 0, 2: 0}, "s2": {1: 0, 2: 0}}
        self.calls = 0
        self.fail_after = None          # calls that succeed before the controller "dies"

    def add(self, switch, port, sent_bytes):
        """``switch`` sends ``sent_bytes`` out of ``port`` (its tx counter)."""
        self.sent[switch][port] += sent_bytes

    def receive(self, switch, port, received_bytes):
        """``received_bytes`` arrive at ``switch:port`` from its peer (its rx counter)."""
        self.received[switch][port] += received_bytes

    def __call__(self):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise ControlError("controller closed the control channel")
        # The local port (no link behind it) is reported too, as OVS does.
        return {switch: {**{port: {"tx_bytes": sent, "rx_bytes": self.received[switch][port]}
                            for port, sent in ports.items()},
                         0xfffffffe: {"tx_bytes": 999, "rx_bytes": 0}}
                for switch, ports in self.sent.items()}


class FakeClock:
    def __init__(self, now=1_700_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def rows_of(path):
    with path.open(newline="") as handle:
        return list(csv.reader(handle))


@pytest.fixture
def bed(tmp_path):
    switches, clock, samples = FakeSwitches(), FakeClock(), []
    sampler = LoadSampler(switches, line_fabric(), tmp_path / "load.csv", interval_s=NEVER_S,
                          on_sample=samples.append, clock=clock)
    return sampler, switches, clock, samples


def test_rates_over_the_measured_interval_exactly(bed):
    sampler, switches, clock, samples = bed
    sampler.start()                                   # the baseline: no rows, no sample
    assert samples == [] and len(rows_of(sampler.path)) == 1

    clock.now += 0.5
    switches.add("s1", 2, 1_000_000)                  # 8 Mbit in 0.5 s: 16 Mbit/s
    switches.add("s2", 2, 500_000)                    # 8 Mbit/s
    switches.receive("s1", 1, 250_000)                # h1 sends 2 Mbit in 0.5 s: 4 Mbit/s
    first = sampler.sample()
    clock.now += 1.25                                 # a late sample: measured, not nominal
    switches.add("s1", 2, 250_000)                    # 2 Mbit in 1.25 s: 1.6 Mbit/s
    second = sampler.sample()
    sampler.stop()

    assert first == {"t": 1_700_000_000.5, "interval_s": 0.5,
                     "links": [["s1", 1, "h1", 1, 0.0], ["h1", 1, "s1", 1, 4.0],
                               ["s1", 2, "s2", 1, 16.0], ["s2", 1, "s1", 2, 0.0],
                               ["s2", 2, "h2", 1, 8.0], ["h2", 1, "s2", 2, 0.0]]}
    assert second["interval_s"] == 1.25
    assert [link[4] for link in second["links"]] == [0.0, 0.0, 1.6, 0.0, 0.0, 0.0]
    assert samples == [first, second]                 # on_sample got each, in order
    assert sampler.error is None and sampler.samples == 2


def test_csv_has_the_documented_columns_and_one_row_per_wired_port(bed):
    sampler, switches, clock, _ = bed
    sampler.start()
    clock.now += 0.5
    switches.add("s1", 2, 1_000_000)
    switches.receive("s2", 2, 125_000)                # h2 sends 1 Mbit in 0.5 s: 2 Mbit/s
    sampler.sample()
    sampler.stop()
    header, *rows = rows_of(sampler.path)
    assert tuple(header) == LOAD_COLUMNS == REPORT_LOAD_COLUMNS
    assert header == ["t", "node", "port", "peer", "peer_port", "bytes", "mbps"]
    # The switches' local port (0xfffffffe) is wired to nothing: no row.  A host's
    # side is its own row, node=the host, counted by its switch port's rx counter.
    assert rows == [["1700000000.500000", "s1", "1", "h1", "1", "0", "0.0"],
                    ["1700000000.500000", "h1", "1", "s1", "1", "0", "0.0"],
                    ["1700000000.500000", "s1", "2", "s2", "1", "1000000", "16.0"],
                    ["1700000000.500000", "s2", "1", "s1", "2", "0", "0.0"],
                    ["1700000000.500000", "s2", "2", "h2", "1", "0", "0.0"],
                    ["1700000000.500000", "h2", "1", "s2", "2", "125000", "2.0"]]


def test_a_counter_that_goes_down_counts_as_zero(bed):
    sampler, switches, clock, _ = bed
    switches.add("s1", 2, 5_000_000)
    sampler.start()
    clock.now += 0.5
    switches.sent["s1"][2] = 1_000                    # the port was reset
    sample = sampler.sample()
    sampler.stop()
    assert sample["links"][2] == ["s1", 2, "s2", 1, 0.0]
    assert rows_of(sampler.path)[3][5:] == ["1000", "0.0"]


def test_stop_takes_one_last_sample_and_closes_the_file(bed):
    sampler, switches, clock, samples = bed
    sampler.start()
    clock.now += 0.2                                  # stop() before any deadline
    switches.add("s2", 2, 100_000)                    # 0.8 Mbit in 0.2 s: 4 Mbit/s
    sampler.stop()
    sampler.stop()                                    # harmless twice
    assert len(samples) == 1 and samples[0]["interval_s"] == pytest.approx(0.2)
    assert samples[0]["links"][4][:4] == ["s2", 2, "h2", 1]
    assert samples[0]["links"][4][4] == pytest.approx(4.0)
    rows = rows_of(sampler.path)
    assert len(rows) == 1 + DIRECTIONS and rows[-1][1:3] == ["h2", "1"]
    assert sampler.sample() is None                   # closed: nothing more is written


def test_a_controller_that_goes_away_ends_sampling_quietly(bed):
    sampler, switches, clock, samples = bed
    switches.fail_after = 2                           # baseline, one sample, then gone
    sampler.start()
    clock.now += 0.5
    switches.add("s1", 2, 1_000_000)
    assert sampler.sample() is not None
    clock.now += 0.5
    assert sampler.sample() is None                   # no exception
    assert "ControlError" in sampler.error and "closed the control channel" in sampler.error
    calls = switches.calls
    clock.now += 0.5
    assert sampler.sample() is None and switches.calls == calls   # asked no more
    sampler.stop()                                    # no final sample, no exception
    assert switches.calls == calls
    assert len(rows_of(sampler.path)) == 1 + DIRECTIONS   # what was written is kept
    assert len(samples) == 1


def test_the_thread_samples_until_the_counters_fail(tmp_path):
    switches = FakeSwitches()
    switches.fail_after = 4                           # baseline and three samples
    sampler = LoadSampler(switches, line_fabric(), tmp_path / "load.csv", interval_s=0.01)
    sampler.start()
    wait_until(lambda: sampler.error is not None, 5.0, "the sampler to see the failure")
    sampler._thread.join(5.0)
    assert not sampler._thread.is_alive()             # the thread ended by itself
    sampler.stop()
    assert sampler.samples == 3 and len(rows_of(sampler.path)) == 1 + 3 * DIRECTIONS


def test_a_failing_baseline_leaves_a_header_and_an_error(tmp_path):
    switches = FakeSwitches()
    switches.fail_after = 0
    sampler = LoadSampler(switches, line_fabric(), tmp_path / "load.csv").start()
    sampler.stop()
    assert sampler.error and rows_of(sampler.path) == [list(LOAD_COLUMNS)]


def test_an_on_sample_that_raises_does_not_cost_the_record(tmp_path):
    switches, clock = FakeSwitches(), FakeClock()

    def broken(sample):
        raise RuntimeError("the page went away")

    sampler = LoadSampler(switches, line_fabric(), tmp_path / "load.csv",
                          interval_s=NEVER_S, on_sample=broken, clock=clock).start()
    for _ in range(2):
        clock.now += 0.5
        assert sampler.sample() is not None
    sampler.stop()
    assert sampler.on_sample is None and len(rows_of(sampler.path)) == 1 + 2 * DIRECTIONS


def test_interval_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="interval_s"):
        LoadSampler(FakeSwitches(), line_fabric(), tmp_path / "load.csv", interval_s=0)


def test_helpers_the_lab_cli_shares():
    fabric = line_fabric()
    before = {("s1", 2): 100, ("s2", 2): 50}
    after = {("s1", 2): 1_250_100, ("s2", 2): 10, ("s1", 1): 999}
    assert link_rates(wired_ports(fabric), before, after, 2.0) == [
        ("s1", 2, "s2", 1, 5.0), ("s2", 2, "h2", 1, 0.0)]   # s1:1 only in one reading


def test_wired_ports_lists_a_hosts_direction_right_after_its_switch_port():
    assert wired_ports(line_fabric()) == [
        ("s1", 1, "h1", 1), ("h1", 1, "s1", 1),
        ("s1", 2, "s2", 1),
        ("s2", 1, "s1", 2),
        ("s2", 2, "h2", 1), ("h2", 1, "s2", 2)]


def test_sent_bytes_takes_a_hosts_side_from_its_switch_ports_rx_counter():
    fabric = line_fabric()
    counters = {"s1": {1: {"tx_bytes": 10, "rx_bytes": 20},     # s1:1 <-> h1
                       2: {"tx_bytes": 30, "rx_bytes": 40}},    # s1:2 <-> s2
                "s2": {2: {"tx_bytes": 50, "rx_bytes": 60},     # s2:2 <-> h2
                       0xfffffffe: {"tx_bytes": 7, "rx_bytes": 8}}}
    # A switch-to-switch port's rx is the peer switch's tx, counted there: not
    # taken twice.  The local port is kept (nothing is wired to it, so no row).
    assert sent_bytes(counters, fabric) == {
        ("s1", 1): 10, ("h1", 1): 20, ("s1", 2): 30,
        ("s2", 2): 50, ("h2", 1): 60, ("s2", 0xfffffffe): 7}
    # The control channel's JSON keys ports by string; they measure the same.
    assert sent_bytes({"s1": {"1": {"tx_bytes": 7, "rx_bytes": 3}}}, fabric) == \
        {("s1", 1): 7, ("h1", 1): 3}
    # A port that reports no rx counter leaves its host's side unmeasured.
    assert sent_bytes({"s1": {1: {"tx_bytes": 7}}}, fabric) == {("s1", 1): 7}
    # A switch the fabric does not name: its tx counters only.
    assert sent_bytes({"x9": {1: {"tx_bytes": 5, "rx_bytes": 6}}}, fabric) == {("x9", 1): 5}
