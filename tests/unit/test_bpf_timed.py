"""Reconfigurations and schedules timed by the kernel: the BPF panel's ARMING
entries and ``arm`` program, the applier's timed write, the reconfiguration
sequence around it, the service's schedule op and the daemon's panel choice.

A reconfiguration is written with times *relative* to the moment the
kernel's ``arm`` program anchors them, so that a controller stalled before
its write moves the dark window but never shortens it.  The pure parts
(entries, the applier's arithmetic, the sequence, the service) run over
fakes; the kernel's side (``arm``, the verdicts of ``ocs_panel``) runs under
BPF_PROG_TEST_RUN, which needs root and clang: those tests are skipped, with
the reason, without them.
"""

import errno
import logging
import struct
import time
from types import SimpleNamespace

import pytest
from fake_kernel import FakeKernel
from fakes import RecordingApplier
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from controllers import schedule as schedules
from controllers.bpf import entry, libbpf
from controllers.bpf.entry import ARMING, FOREVER, TIMED, Circuit, armed, arming, peer_at
from controllers.bpf.libbpf import PanelError, PanelObject
from controllers.intents import Lightpath, Reset
from controllers.netlink import bpfpanel, daemon, namespaces, wire
from controllers.netlink.applier import NetlinkApplier, NetlinkError
from controllers.netlink.bpfpanel import BpfPatchPanel, Clock
from controllers.netlink.daemon import KernelPlane
from controllers.netlink.patch import PatchSocket
from controllers.reconfig import reconfigure
from controllers.schedule import ScheduleError
from controllers.service import FabricService
from topologies import registry
from topologies.fabric import FabricError

OK, SHOT, REDIRECT = 0, 2, 7
S, MS, US = 10**9, 10**6, 10**3
LEAD_NS = 50 * US                     # bpfpanel.DEFAULT_LEAD_S


def now() -> int:
    return time.monotonic_ns()


# ------------------------------------------------------------------ the filter message
def test_a_bpf_filter_is_a_direct_action_cls_bpf_on_the_ports_ingress():
    data = bpfpanel.filter_add(seq=9, ifindex=12, program_fd=33, name="ocs_panel", prio=3)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", data)
    assert (length, kind, seq) == (len(data), bpfpanel.RTM_NEWTFILTER, 9)
    assert flags == wire.NLM_F_REQUEST | wire.NLM_F_ACK | wire.NLM_F_CREATE | wire.NLM_F_EXCL
    msg = tcmsg(data)
    msg.decode()
    assert msg["index"] == 12 and msg["parent"] == 0xFFFF0000, "the ingress qdisc, ffff:"
    assert msg["info"] >> 16 == 3, "the priority"
    assert msg["info"] & 0xFFFF == struct.unpack("=H", struct.pack("!H", 0x0003))[0], \
        "ETH_P_ALL in network order: every frame"
    assert msg.get_attr("TCA_KIND") == "bpf"
    options = msg.get_attr("TCA_OPTIONS")
    assert options.get_attr("TCA_BPF_FD") == 33
    assert options.get_attr("TCA_BPF_NAME") == "ocs_panel"
    assert options.get_attr("TCA_BPF_FLAGS") == 1, \
        "direct action: the program's return code is the verdict (no action needed)"


# ------------------------------------------------------------------ the clock
def test_clock_converts_epoch_seconds_to_monotonic_ns_and_back_within_a_microsecond():
    clock = Clock()
    for epoch in (time.time(), time.time() + 3600.123456, 1.7e9):
        assert abs(clock.to_epoch(clock.to_mono(epoch)) - epoch) < 1e-6
    mono = clock.now_ns()
    assert abs(clock.to_mono(clock.to_epoch(mono)) - mono) < 1_000
    assert abs(clock.to_epoch(Clock.now_ns()) - time.time()) < 0.01, \
        "the offset joins the two clocks"


# ------------------------------------------------------------------ arming entries
def test_an_arming_entry_keeps_the_old_circuit_whatever_the_time():
    """Not anchored yet, the change has not begun: its relative times mean nothing."""
    circuit = arming(5, 10 * MS, 6, 20 * MS)
    assert (circuit.mode, circuit.peer_now, circuit.dark_at, circuit.peer_next,
            circuit.lit_at) == (ARMING, 5, 10 * MS, 6, 20 * MS)
    for t in (0, 15 * MS, 30 * MS, 10**18):
        assert peer_at(circuit, t) == 5
    assert peer_at(arming(0, 0, 6, 20 * MS), 30 * MS) == 0, "a port only lit: dark until armed"
    assert entry.unpack(circuit.pack()) == circuit, "mode 2 survives the bytes"


def test_armed_adds_the_anchor_to_both_times_and_makes_the_entry_timed():
    anchor = 7 * S
    got = armed(arming(5, 10 * MS, 6, 20 * MS), anchor)
    assert got == Circuit(mode=TIMED, peer_now=5, dark_at=anchor + 10 * MS, peer_next=6,
                          lit_at=anchor + 20 * MS)
    assert [peer_at(got, anchor + t) for t in (5 * MS, 15 * MS, 25 * MS)] == [5, 0, 6]


def test_armed_leaves_forever_forever_and_other_entries_alone():
    torn = armed(arming(5, 10 * MS, 0, FOREVER), 7 * S)
    assert (torn.dark_at, torn.lit_at) == (7 * S + 10 * MS, FOREVER)
    never = armed(arming(5, FOREVER, 0, FOREVER), 7 * S)
    assert (never.mode, never.dark_at, never.lit_at) == (TIMED, FOREVER, FOREVER)
    for other in (entry.lit(3), entry.dark(), entry.timed(3, 100, 4, 200),
                  entry.cyclic(0, S, MS, [3, 4])):
        assert armed(other, 7 * S) is other


def test_arming_refuses_a_light_before_the_tear():
    with pytest.raises(ValueError, match="before dark_at"):
        arming(5, 20 * MS, 6, 10 * MS)


# ------------------------------------------------------------------ arm, in the kernel
@pytest.fixture
def panel(object_file):
    """A fresh object per test: fresh maps, armed_at zero."""
    try:
        obj = PanelObject.load(object_file)
    except PanelError as exc:
        if exc.errno == errno.EPERM:
            pytest.skip(f"this root may not load BPF programs (a container?): {exc}")
        raise
    yield obj
    obj.close()


ANY_FRAME = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01\x08\x00" + \
    struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 17, 0, bytes([10, 0, 0, 1]),
                bytes([10, 0, 9, 9])) + bytes(8)


def at_port(obj, port: int) -> int:
    return libbpf.test_run(obj.program_fd("ocs_panel"), ANY_FRAME, ifindex=port)


def arm(obj) -> int:
    """Run ``arm``; the anchor it wrote to ``armed_at``."""
    assert libbpf.run_syscall(obj.program_fd("arm")) == 0
    return int.from_bytes(obj.map("armed_at").lookup(0), "little")


def test_arm_anchors_every_arming_entry_on_the_kernels_clock_and_leaves_the_rest(panel):
    ports = panel.map("ports")
    t = now()
    untouched = {4: entry.lit(9), 5: entry.timed(5, t + S, 6, t + 2 * S),
                 6: entry.cyclic(t, S, MS, [3, 4], before=entry.lit(8)), 8: entry.dark()}
    to_arm = {1: arming(5, 10 * MS, 6, 20 * MS),          # torn and lit again
              2: arming(7, 10 * MS, 0, FOREVER),          # torn only
              3: arming(0, 0, 8, 20 * MS),                # lit only
              7: arming(5, FOREVER, 0, FOREVER)}          # nothing ever happens
    ports.update_many([(port, c.pack()) for port, c in {**untouched, **to_arm}.items()])
    assert int.from_bytes(panel.map("armed_at").lookup(0), "little") == 0, "never armed yet"
    before = now()
    anchor = arm(panel)
    after = now()
    assert before <= anchor <= after, "the kernel's CLOCK_MONOTONIC, read during the run"
    read = {port: entry.unpack(ports.lookup(port)) for port in sorted(ports.keys())}
    assert read[1] == Circuit(peer_now=5, dark_at=anchor + 10 * MS, peer_next=6,
                              lit_at=anchor + 20 * MS)
    assert read[2] == Circuit(peer_now=7, dark_at=anchor + 10 * MS, lit_at=FOREVER)
    assert read[3] == Circuit(peer_now=0, dark_at=anchor, peer_next=8, lit_at=anchor + 20 * MS)
    assert read[7] == Circuit(peer_now=5, dark_at=FOREVER, lit_at=FOREVER)
    assert {port: read[port] for port in to_arm} == \
        {port: armed(c, anchor) for port, c in to_arm.items()}, "entry.armed says what arm does"
    assert {port: read[port] for port in untouched} == untouched


def test_a_second_arm_moves_nothing_already_anchored(panel):
    ports = panel.map("ports")
    ports.update(1, arming(5, 10 * MS, 6, 20 * MS).pack())
    first = arm(panel)
    anchored = ports.lookup(1)
    second = arm(panel)
    assert second >= first
    assert ports.lookup(1) == anchored, "only ARMING entries are anchored, once"


def test_an_armed_reconfiguration_is_dark_in_its_window_and_lit_to_the_new_peer_after(panel):
    window = 100 * MS
    ports = panel.map("ports")
    written = {1: arming(5, window, 6, 2 * window), 2: arming(7, window, 0, FOREVER),
               3: arming(0, 0, 8, 2 * window)}
    ports.update_many([(port, c.pack()) for port, c in written.items()])
    time.sleep(0.01)
    assert [at_port(panel, port) for port in (1, 2, 3)] == [REDIRECT, REDIRECT, SHOT], \
        "until arm runs, the old circuits hold however long it takes"
    anchor = arm(panel)
    circuits = {port: entry.unpack(ports.lookup(port)) for port in written}
    expected = {1: [REDIRECT, SHOT, REDIRECT], 2: [REDIRECT, SHOT, SHOT], 3: [SHOT, SHOT, REDIRECT]}
    checked = {port: [] for port in written}
    for phase, middle in enumerate((anchor + window // 2, anchor + 3 * window // 2,
                                    anchor + 5 * window // 2)):
        time.sleep(max(0, middle - now()) / 1e9)
        for port, circuit in circuits.items():
            before = now()
            verdict = at_port(panel, port)
            after = now()
            # Asserted only when the run did not straddle a switch time (a stalled machine).
            if bool(peer_at(circuit, before)) == bool(peer_at(circuit, after)):
                assert verdict == (REDIRECT if peer_at(circuit, before) else SHOT)
                checked[port].append(verdict)
    assert checked == expected


class AckingSocket:
    """A netlink socket that acknowledges every request (as test_patch's Loopback)."""

    def __init__(self):
        self.sent, self.closed = [], False

    def send(self, data):
        self.sent.append(data)

    def recv(self, size):
        seq = struct.unpack_from("=IHHII", self.sent[-1])[3]
        return struct.pack("=IHHII", 36, wire.NLMSG_ERROR, 0, seq, 0) + struct.pack("=i", 0) + \
            self.sent[-1][:16]

    def close(self):
        self.closed = True


def test_the_panels_timed_write_returns_the_anchor_its_entries_got(panel):
    bpf = BpfPatchPanel(AckingSocket(), obj=panel, clock=Clock())
    changes = {11: arming(13, LEAD_NS, 14, LEAD_NS + 3 * MS), 13: arming(11, LEAD_NS, 0, FOREVER)}
    before = now()
    anchor = bpf.timed(changes)
    after = now()
    assert before <= anchor <= after
    assert {port: bpf.entry(port) for port in changes} == \
        {port: armed(c, anchor) for port, c in changes.items()}
    assert bpf.entry(12) is None


def test_the_panel_attaches_ocs_panel_to_every_port_and_starts_them_dark(panel):
    sock = AckingSocket()
    bpf = BpfPatchPanel(sock, obj=panel, clock=Clock())
    w0, w1 = bpf.light(11, 12)
    assert w0 <= w1 and bpf.entry(11) == entry.lit(12)
    bpf.attach_ports([11, 12, 13])
    assert bpf.entry(11) is None, "every port dark until its circuit is lit"
    messages = []
    for data in sock.sent:
        msg = tcmsg(data)
        msg.decode()
        messages.append((msg["index"], msg.get_attr("TCA_OPTIONS").get_attr("TCA_BPF_FD"),
                         msg.get_attr("TCA_OPTIONS").get_attr("TCA_BPF_NAME")))
    fd = panel.program_fd("ocs_panel")
    assert messages == [(11, fd, "ocs_panel"), (12, fd, "ocs_panel"), (13, fd, "ocs_panel")]
    bpf.dark(12)
    assert bpf.entry(12) is None


def test_the_applier_writes_a_reconfiguration_the_kernel_then_times(panel):
    """End to end below the service: Lightpath intents in, anchored entries in
    the OCS's map out, and the epoch times the applier returns are the
    kernel's anchored times."""
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=1,uplinks=2")
    kernel = FakeKernel(fabric)
    applier = NetlinkApplier(fabric)
    bpf = BpfPatchPanel(AckingSocket(), obj=panel, clock=Clock())
    applier.attach("o1", kernel.sockets["o1"], patch=bpf)
    tear, light = [Lightpath("o1", 2, 3, False)], [Lightpath("o1", 2, 4, True)]
    dark_from, lit_at, _ = applier.timed_circuits("o1", tear, light, delay_s=0.004)
    anchor = int.from_bytes(panel.map("armed_at").lookup(0), "little")
    assert anchor > 0
    assert bpf.entry(102) == entry.timed(103, anchor + LEAD_NS, 104, anchor + LEAD_NS + 4 * MS)
    assert bpf.entry(103) == entry.timed(102, anchor + LEAD_NS, 0, FOREVER)
    assert bpf.entry(104) == entry.timed(0, anchor, 102, anchor + LEAD_NS + 4 * MS)
    assert bpf.entry(101) is None
    assert dark_from == bpf.clock.to_epoch(anchor + LEAD_NS)
    assert lit_at == bpf.clock.to_epoch(anchor + LEAD_NS + 4 * MS)


# ------------------------------------------------------------------ the applier's timed write
class FakeTimedPanel:
    """What the applier needs of a BPF panel: its anchor comes from the test."""

    kernel_timed = True
    kind = "bpf"

    def __init__(self, anchor_ns: int = 5_000 * S):
        self.clock = Clock()
        self.anchor_ns = anchor_ns
        self.writes, self.schedules, self.attached, self.lit = [], [], [], []

    def timed(self, changes):
        self.writes.append(dict(changes))
        return self.anchor_ns

    def schedule(self, changes):
        self.schedules.append(dict(changes))
        return (1.0, 2.0)

    def attach_ports(self, ifindexes):
        self.attached.append(list(ifindexes))

    def light(self, index, peer, prio):
        self.lit.append((index, peer))
        return (0.0, 0.0)

    def dark(self, index, prio):
        return (0.0, 0.0)

    def close(self):
        pass


def small_applier(patch=None):
    """hybrid, 2 ToRs with 2 uplinks each: o1 ports 1-2 from s1 and 3-4 from s2,
    ifindex 100 + port (the fake kernel's), circuit 2-3 lit."""
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=1,uplinks=2")
    kernel = FakeKernel(fabric)
    applier = NetlinkApplier(fabric)
    for switch in fabric.switches:
        applier.attach(switch, kernel.sockets[switch],
                       patch=patch if switch == "o1" else None)
    return fabric, kernel, applier


def test_timed_circuits_writes_arming_entries_with_the_peers_and_offsets():
    patch = FakeTimedPanel()
    _, _, applier = small_applier(patch)
    tear, light = [Lightpath("o1", 2, 3, False)], [Lightpath("o1", 2, 4, True)]
    before = time.time()
    dark_from, lit_at, written = applier.timed_circuits("o1", tear, light, delay_s=0.004)
    after = time.time()
    (changes,) = patch.writes
    lit_in = LEAD_NS + 4 * MS
    assert changes == {
        102: arming(103, LEAD_NS, 104, lit_in),    # torn from 3, lit to 4
        103: arming(102, LEAD_NS, 0, FOREVER),     # torn only: dark for good
        104: arming(0, 0, 102, lit_in),            # lit only: dark until lit
    }, "port 1 (in no circuit that changes) is not written"
    assert all(c.mode == ARMING for c in changes.values())
    assert dark_from == patch.clock.to_epoch(patch.anchor_ns + LEAD_NS)
    assert lit_at == patch.clock.to_epoch(patch.anchor_ns + lit_in)
    assert lit_at - dark_from == pytest.approx(0.004, abs=1e-6)
    assert before <= written[0] <= written[1] <= after


def test_timed_circuits_takes_another_lead_and_rounds_the_delay_to_a_nanosecond():
    patch = FakeTimedPanel(anchor_ns=10 * S)
    _, _, applier = small_applier(patch)
    applier.timed_circuits("o1", [Lightpath("o1", 2, 3, False)], [Lightpath("o1", 1, 4, True)],
                           delay_s=15e-6, lead_s=0.001)
    (changes,) = patch.writes
    assert changes[102] == arming(103, MS, 0, FOREVER)
    assert changes[101] == arming(0, 0, 104, MS + 15 * US), \
        "15 us: not 14999 ns, as truncating 15e-6 x 1e9 would give"


def test_the_applier_says_which_ocs_runs_which_panel():
    patch = FakeTimedPanel()
    _, kernel, applier = small_applier(patch)
    assert applier.kernel_timed("o1") and applier.panel() == {"o1": "bpf"}
    assert applier.status()["panel"] == {"o1": "bpf"}
    _, _, mirred = small_applier(SimpleNamespace(close=lambda: None))
    assert not mirred.kernel_timed("o1") and mirred.panel() == {"o1": "mirred"}
    _, _, plain = small_applier(None)
    assert plain.panel() == {"o1": "pyroute2"}


def test_a_reset_gives_a_bpf_panels_ports_the_program_after_their_fresh_ingress_qdiscs():
    patch = FakeTimedPanel()
    fabric, kernel, applier = small_applier(patch)
    seen = []
    patch.attach_ports = lambda ifindexes: seen.append((list(ifindexes),
                                                        set(kernel.sockets["o1"].ingress)))
    applier.apply({"o1": [Reset("o1"), Lightpath("o1", 2, 3, True)]})
    assert seen == [([101, 102, 103, 104], {101, 102, 103, 104})]
    assert patch.lit == [(102, 103), (103, 102)], "then the circuits, in the map"


class FakeTimeflow:
    def __init__(self):
        self.attached, self.written = [], []

    def attach(self, ifindexes, program):
        self.attached.append((list(ifindexes), program))

    def write(self, changes):
        self.written.append(dict(changes))

    def close(self):
        pass


def test_set_schedule_opens_each_tors_table_once_and_clear_schedule_empties_them():
    fabric = registry.build("rotor,tors=4")
    kernel = FakeKernel(fabric)
    applier = NetlinkApplier(fabric)
    tables = {}
    for switch in fabric.switches:
        ocs = switch in fabric.ocs_switches
        applier.attach(switch, kernel.sockets[switch], patch=FakeTimedPanel() if ocs else None,
                       timeflow=None if ocs else
                       (lambda name=switch: tables.setdefault(name, FakeTimeflow())))
    plan = schedules.rotor_schedule(fabric, 100e-6, 10e-6)
    ocs_entries = schedules.compile_ocs(plan, applier.indexes, 7 * S)
    tor_entries = schedules.compile_tor(plan, fabric, applier.indexes, 7 * S)
    applier.set_schedule(ocs_entries, tor_entries)
    applier.set_schedule(ocs_entries, tor_entries)
    assert sorted(tables) == ["s1", "s2", "s3", "s4"]
    s1 = tables["s1"]
    assert s1.attached == [([101], "tor_timeflow"), ([102, 103, 104], "tor_uplink")], \
        "once, though written twice: the host port looks up, the uplinks guard"
    assert kernel.sockets["s1"].ingress >= {101, 102, 103, 104}
    assert s1.written == [tor_entries["s1"]] * 2
    assert applier.patches["o1"].schedules == [ocs_entries["o1"]] * 2
    applier.clear_schedule()
    assert all(table.written[-1] == {} for table in tables.values())


def test_set_schedule_refuses_an_ocs_that_does_not_time_its_circuits():
    fabric, _, applier = small_applier(SimpleNamespace(close=lambda: None))
    with pytest.raises(NetlinkError, match=r"o1: schedules need the BPF patch panel "
                                           r"\(this OCS runs the mirred one\)"):
        applier.set_schedule({"o1": {}}, {})
    _, _, bpf = small_applier(FakeTimedPanel())
    with pytest.raises(NetlinkError, match="s1: no time-flow table"):
        bpf.set_schedule({}, {"s1": {}})


# ------------------------------------------------------------------ the sequence, timed
PARTIAL = [(2, 3), (4, 5), (1, 7), (6, 8)]     # as test_reconfig: keep two, move two


def timed_sequence(timed, events):
    """reconfigure() on hybrid,tors=4 (3 ms custom, tdf 2) with every call it
    makes recorded into ``events``: batches (their switches), waits, syncs and steps."""
    fabric = registry.build("hybrid,tors=4,hosts_per_tor=1")
    svc = FabricService(fabric, RecordingApplier(fabric), tdf=2.0)
    core = svc.ocs["o1"]
    core.set_technology("custom", 3.0)
    ticks = iter(range(100))
    result = reconfigure(svc.eps, core, core.plan(PARTIAL),
                         lambda batch: events.append(sorted(batch)),
                         clock=lambda: float(next(ticks)),
                         wait_until=lambda t: events.append(("wait", t)),
                         sync=lambda: events.append("sync"),
                         on_step=lambda step, fields: events.append((step, fields)),
                         timed=timed)
    return fabric, result


def label(event):
    """A step by its name; batches, waits and the rest as they are."""
    return event[0] if isinstance(event, tuple) and event[0] != "wait" else event


def test_a_kernel_timed_reconfiguration_is_one_write_then_waits_for_the_kernels_times():
    events, calls = [], []

    def timed(tear, light, delay_s):
        calls.append((tear, light, delay_s))
        events.append("timed")
        return 100.0, 100.006, (99.0, 99.5)

    fabric, result = timed_sequence(timed, events)
    assert [label(e) for e in events] == [
        "start", ["s1", "s3"], "timed", ("wait", 100.0), ["s4"], "dark", ("wait", 100.006),
        "lit", ["s1", "s3"], "done"], \
        "moves; the one write; the repoint only once the kernel tore; no OCS batch, no sync"
    ((tear, light, delay_s),) = calls
    assert tear == [Lightpath("o1", 1, 8, False), Lightpath("o1", 6, 7, False)]
    assert light == [Lightpath("o1", 1, 7, True), Lightpath("o1", 6, 8, True)]
    assert delay_s == pytest.approx(0.006), "3 ms x tdf 2, emulated"
    steps = {e[0]: e[1] for e in events if isinstance(e, tuple) and e[0] != "wait"}
    assert steps["dark"]["t"] == 100.0 and steps["dark"]["dark_until"] == 100.006
    assert steps["lit"]["t"] == 100.006
    assert steps["done"]["dark_s"] == result["dark_s"]
    assert result["kernel_timed"] is True
    assert result["dark_from"] == 100.0
    assert result["dark_s"] == 100.006 - 100.0
    assert result["write_window"] == [99.0, 99.5]
    stamps = result["timestamps"]
    assert (stamps["torn"], stamps["dark_end"], stamps["lit"]) == (100.0, 100.006, 100.006)
    assert (result["light_lead_s"], result["light_latency_s"]) == (0.0, 0.0)
    assert fabric.circuits["o1"] == set(PARTIAL), "committed"


def test_a_plan_that_changes_no_circuit_never_calls_timed():
    fabric = registry.build("hybrid,tors=4,hosts_per_tor=1")
    svc = FabricService(fabric, RecordingApplier(fabric))
    core = svc.ocs["o1"]
    unchanged = core.plan(sorted(fabric.circuits["o1"]))
    result = reconfigure(svc.eps, core, unchanged, lambda batch: None,
                         wait_until=lambda t: None, timed=lambda *args: pytest.fail("called"))
    assert "kernel_timed" not in result


def test_without_timed_the_sequence_is_the_five_rounds_it_always_was():
    events = []
    _, result = timed_sequence(None, events)
    labels = ["wait" if isinstance(e, tuple) and e[0] == "wait" else label(e) for e in events]
    assert labels == ["start", ["s1", "s3"], ["o1"], "sync", ["s4"], "dark", "wait", ["o1"],
                      "sync", "lit", ["s1", "s3"], "done"]
    assert "kernel_timed" not in result


# ------------------------------------------------------------------ the service's schedule op
def ifindexes(fabric):
    """node -> port -> a made-up ifindex, distinct over the fabric (1000 x node + port)."""
    return {node: {port: 1000 * (i + 1) + port for port in fabric.ports_of(node)}
            for i, node in enumerate(fabric.switches)}


class SchedulingApplier(RecordingApplier):
    """A recording applier with what `do_schedule` asks of the netlink one."""

    def __init__(self, fabric):
        super().__init__(fabric)
        self.indexes = ifindexes(fabric)
        clock = Clock()
        self.patches = {ocs: SimpleNamespace(clock=clock) for ocs in fabric.ocs_switches}
        self.schedules, self.cleared = [], 0

    def set_schedule(self, ocs_entries, tor_entries):
        self.schedules.append((ocs_entries, tor_entries))
        return (1.5, 2.5)

    def clear_schedule(self):
        self.cleared += 1

    def kernel_timed(self, ocs):
        return ocs in self.patches


ROTOR = {"rotor": True, "slot_us": 100, "guard_us": 10}


def scheduling_service(tdf=10.0):
    fabric = registry.build("rotor,tors=4")
    applier = SchedulingApplier(fabric)
    service = FabricService(fabric, applier, tdf=tdf)
    published = []
    service.events.publish = published.append
    return fabric, applier, service, published


def test_a_rotor_schedule_compiles_ocs_and_tor_entries_from_now_plus_the_start():
    fabric, applier, service, published = scheduling_service(tdf=10.0)
    clock = applier.patches["o1"].clock
    before = clock.now_ns()
    reply = service.do_schedule(ROTOR)
    after = clock.now_ns()
    epoch_ns = reply["epoch_mono_ns"]
    assert before + 50 * MS <= epoch_ns <= after + 50 * MS, "slot 0 starts 50 ms from now"
    assert reply["epoch"] == clock.to_epoch(epoch_ns)
    assert reply["slot_emulated_s"] == pytest.approx(1e-3) and \
        reply["guard_emulated_s"] == pytest.approx(1e-4), "100 and 10 us real, x tdf 10"
    assert (reply["slots"], reply["ocs"]) == (3, ["o1", "o2", "o3"])
    assert reply["duty_cycle"] == pytest.approx(0.9) and reply["write_window"] == [1.5, 2.5]
    ((ocs_entries, tor_entries),) = applier.schedules
    assert sorted(ocs_entries) == ["o1", "o2", "o3"]
    for ocs, by_port in ocs_entries.items():
        assert sorted(by_port) == sorted(applier.indexes[ocs].values())
        for circuit in by_port.values():
            assert (circuit.mode, circuit.nslots, circuit.epoch, circuit.period,
                    circuit.guard) == (entry.CYCLIC, 3, epoch_ns, 1 * MS, 100 * US)
    index = applier.indexes["o1"]
    for a, b in fabric.circuits["o1"]:
        assert ocs_entries["o1"][index[a]].peers[0] == index[b], \
            "slot 0 is the fabric's initial circuits"
    assert sorted(tor_entries) == ["s1", "s2", "s3", "s4"]
    assert all(len(table) == 3 for table in tor_entries.values()), "the other ToRs' hosts"
    assert all(c.guard == 0 and c.epoch == epoch_ns for table in tor_entries.values()
               for c in table.values()), "the OCS enforces the guard, the ToR only follows"
    plan = schedules.rotor_schedule(fabric, 100e-6, 10e-6, tdf=10.0)
    assert ocs_entries == schedules.compile_ocs(plan, applier.indexes, epoch_ns)
    assert tor_entries == schedules.compile_tor(plan, fabric, applier.indexes, epoch_ns)
    assert published == [{"kind": "schedule", "t": pytest.approx(time.time(), abs=5),
                          **reply}]
    assert service.state()["schedule"] == reply


def test_a_schedule_comes_over_the_handle_op_too():
    _, applier, service, _ = scheduling_service()
    reply = service.handle({"op": "schedule", "schedule": ROTOR, "start_in_s": 0})
    assert reply["epoch_mono_ns"] <= applier.patches["o1"].clock.now_ns()
    assert service.handle({"op": "schedule", "stop": True})["stopped"] is True


def test_reconfigure_is_refused_while_a_schedule_runs_and_nothing_is_applied():
    _, applier, service, _ = scheduling_service()
    service.do_schedule(ROTOR)
    with pytest.raises(FabricError, match=r"o1: a schedule runs; stop it first"):
        service.do_reconfigure("o1", [(1, 2), (3, 4)])
    assert applier.batches == [] and service.ocs["o1"].history == []


def test_a_reconfigure_refused_for_a_schedule_leaves_the_technology_alone():
    fabric, _, service, _ = scheduling_service()
    service.do_schedule(ROTOR)
    before = service.state()["technology"]["o1"]
    with pytest.raises(FabricError, match="a schedule runs"):
        service.do_reconfigure("o1", [(1, 2), (3, 4)], technology="custom", delay_ms=7.0)
    assert service.state()["technology"]["o1"] == before


def test_stop_clears_the_tors_and_puts_the_ocses_steady_circuits_back():
    fabric, applier, service, published = scheduling_service()
    started = service.do_schedule(ROTOR)
    published.clear()
    reply = service.do_schedule(stop=True)
    assert reply == {"stopped": True, "schedule": started}
    assert applier.cleared == 1
    assert applier.batches == [{ocs: service.start(ocs) for ocs in ("o1", "o2", "o3")}]
    assert applier.batches[0]["o1"][0] == Reset("o1"), "a reset, then the lit circuits"
    assert published == [{"kind": "schedule", "t": pytest.approx(time.time(), abs=5),
                          "stopped": True}]
    assert service.state()["schedule"] is None
    assert service.do_schedule(stop=True) == {"stopped": False} and applier.cleared == 1
    service.do_reconfigure("o1", [(1, 2), (3, 4)], technology="custom", delay_ms=0.0)
    assert fabric.circuits["o1"] == {(1, 2), (3, 4)}, "reconfigurable again"


def test_an_applier_without_schedules_says_what_is_needed():
    fabric = registry.build("rotor,tors=4")
    service = FabricService(fabric, RecordingApplier(fabric))
    with pytest.raises(FabricError, match="schedules need the linux data plane"):
        service.do_schedule(ROTOR)
    with pytest.raises(FabricError, match="give the schedule, or stop=true"):
        scheduling_service()[2].do_schedule()


@pytest.mark.parametrize("data, message", [
    ({"rotor": True, "slot_us": 100}, r"^schedule\.guard_us: missing"),
    ({"rotor": True, "slot_us": 100, "guard_us": 100}, r"^schedule\.guard_us: must be >= 0 "
                                                       r"and < slot_us"),
    ({**ROTOR, "speed": 2}, r"^schedule: unknown key 'speed'"),
    ({"rotor": "yes", "slot_us": 100, "guard_us": 10}, r"^schedule\.rotor: must be true"),
    ({"slot_us": 100, "guard_us": 10, "matchings": {"o9": [[[1, 2]]]}},
     r"^schedule\.matchings\['o9'\]: no OCS 'o9'"),
])
def test_bad_schedule_data_is_refused_naming_the_field_and_nothing_is_written(data, message):
    _, applier, service, published = scheduling_service()
    with pytest.raises(ScheduleError, match=message):
        service.do_schedule(data)
    assert applier.schedules == [] and published == [] and service.schedule is None


def test_a_schedule_on_an_ocs_with_the_mirred_panel_gets_the_appliers_reason():
    fabric = registry.build("rotor,tors=4")
    kernel = FakeKernel(fabric)
    applier = NetlinkApplier(fabric)
    for switch in fabric.switches:
        applier.attach(switch, kernel.sockets[switch],
                       patch=PatchSocket(AckingSocket()) if switch in fabric.ocs_switches
                       else None)
    service = FabricService(fabric, applier)
    with pytest.raises(FabricError, match="run.s. the mirred patch panel; schedules need "
                                          "the BPF one"):
        service.do_schedule(ROTOR)


# ------------------------------------------------------------------ the daemon's panel choice
class FakeNetlinkSocket:
    def __init__(self, pid):
        self.pid, self.closed = pid, False

    def close(self):
        self.closed = True


@pytest.fixture
def opened(monkeypatch):
    """Every netlink socket the daemon opens (fakes)."""
    sockets = []

    def netlink_socket(pid, groups=0):
        sockets.append(FakeNetlinkSocket(pid))
        return sockets[-1]

    monkeypatch.setattr(namespaces, "netlink_socket", netlink_socket)
    return sockets


def panel_loader(monkeypatch, error=None):
    """Stand in for the program's loader (each try recorded; raises ``error``)
    and for BpfPatchPanel (records the socket it was given)."""
    made, tried = [], []

    def load_program():
        tried.append(True)
        if error is not None:
            raise error
        return "program"

    class Loader:
        kernel_timed, kind = True, "bpf"

        def __init__(self, sock, obj=None):
            assert obj == "program"
            made.append(sock)

    monkeypatch.setattr(daemon, "load_program", load_program)
    monkeypatch.setattr(daemon, "BpfPatchPanel", Loader)
    return made, Loader, tried


def test_auto_falls_back_to_the_mirred_panel_and_says_why(monkeypatch, opened, caplog):
    made, _, tried = panel_loader(monkeypatch, PanelError("libbpf is not installed"))
    plane = KernelPlane(registry.build("hybrid"), panel="auto")
    with caplog.at_level(logging.WARNING, logger="fabric.netlink.daemon"):
        patch = plane.patch_socket(4242)
        again = plane.patch_socket(4243)
    assert isinstance(patch, PatchSocket) and isinstance(again, PatchSocket)
    assert len(tried) == 2 and made == [], "each OCS tries the BPF panel"
    note = plane.applier.panel_note
    assert "libbpf is not installed" in note and "mirred panel" in note
    assert plane.applier.status()["panel_note"] == note
    assert len([r for r in caplog.records if "did not load" in r.getMessage()]) == 1, \
        "said once, not once per OCS"
    assert len(opened) == 2, "no socket opened for a panel that did not load"
    assert patch.channel.sock is opened[0], "the mirred panel on a socket of that namespace"
    assert opened[0].pid == 4242


def test_auto_falls_back_on_an_os_error_too(monkeypatch, opened):
    panel_loader(monkeypatch, OSError(errno.EPERM, "Operation not permitted"))
    plane = KernelPlane(registry.build("hybrid"), panel="auto")
    assert isinstance(plane.patch_socket(1), PatchSocket)
    assert "Operation not permitted" in plane.applier.panel_note


def test_auto_takes_the_bpf_panel_when_it_loads(monkeypatch, opened):
    made, Loader, _ = panel_loader(monkeypatch)
    plane = KernelPlane(registry.build("hybrid"), panel="auto")
    assert isinstance(plane.patch_socket(7), Loader)
    assert made == opened and plane.applier.panel_note == ""


def test_bpf_insists_on_the_bpf_panel(monkeypatch, opened):
    panel_loader(monkeypatch, PanelError("libbpf is not installed"))
    plane = KernelPlane(registry.build("hybrid"), panel="bpf")
    with pytest.raises(PanelError, match="libbpf is not installed"):
        plane.patch_socket(1)
    assert plane.applier.panel_note == ""


def test_mirred_never_tries_the_bpf_panel(monkeypatch, opened):
    made, _, tried = panel_loader(monkeypatch)
    plane = KernelPlane(registry.build("hybrid"), panel="mirred")
    assert isinstance(plane.patch_socket(1), PatchSocket)
    assert made == [] and tried == [] and len(opened) == 1 and plane.applier.panel_note == ""


def test_an_unknown_panel_is_refused():
    with pytest.raises(ValueError, match=r"panel 'xdp': allowed auto, bpf, mirred"):
        KernelPlane(registry.build("hybrid"), panel="xdp")


class RefusedPanel:
    """A BPF panel whose program loaded but whose filter the kernel refuses."""
    kernel_timed, kind = True, "bpf"

    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def refusing_start(plane):
    """The applier's start, refusing while the OCS runs the BPF panel."""
    calls = []

    def start(switch, intents):
        calls.append(type(plane.applier.patches.get(switch)).__name__)
        if getattr(plane.applier.patches.get(switch), "kernel_timed", False):
            raise NetlinkError(f"{switch}: Reset: PanelAttachError: unknown filter kind bpf")
    plane.applier.start = start
    return calls


def test_auto_falls_back_when_the_kernel_refuses_the_bpf_filter(opened):
    plane = KernelPlane(registry.build("hybrid"), panel="auto")
    refused = RefusedPanel()
    plane.applier.patches["o1"] = refused
    calls = refusing_start(plane)
    plane._start("o1", 4242)
    assert calls == ["RefusedPanel", "PatchSocket"], "tried, then started on the mirred panel"
    assert refused.closed and isinstance(plane.applier.patches["o1"], PatchSocket)
    assert opened[-1].pid == 4242
    assert "did not attach on o1" in plane.applier.panel_note
    assert "unknown filter kind bpf" in plane.applier.panel_note


def test_bpf_does_not_fall_back_when_the_filter_is_refused(opened):
    plane = KernelPlane(registry.build("hybrid"), panel="bpf")
    plane.applier.patches["o1"] = RefusedPanel()
    refusing_start(plane)
    with pytest.raises(NetlinkError, match="unknown filter kind bpf"):
        plane._start("o1", 1)
    assert plane.applier.panel_note == "" and opened == []
