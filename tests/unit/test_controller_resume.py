"""A controller's crash and its successor: the state file, requests answered once,
the take-over, the Resync's OpenFlow bytes and kernel writes, the pause points,
deferred signals and the atomic result file.  (The keeper: test_keeper.py.)"""

from __future__ import annotations

import json
import os
import signal
import struct
import threading
import time

import pytest
from fake_kernel import FakeKernel
from fakes import FakeDatapath, FakeNetwork, RecordingApplier, decode

from controllers import pause, statefile
from controllers.intents import Lightpath, PinHop, Reset, Resync, Route
from controllers.netlink.applier import NetlinkApplier
from controllers.openflow import messages as ofmsg
from controllers.openflow.compat import ofp, parser
from controllers.service import CHANGING_OPS, FabricService, take_over
from emu import results
from emu.live.interrupts import deferred
from topologies import hybrid, registry

SPEC = "hybrid,tors=2,hosts_per_tor=2"      # two hosts per ToR: a pin h1-s1-h2 exists
PIN_PATH = ["h1", "s1", "h2"]


def wait_for(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def ring_reverse(fabric):
    return sorted(list(c) for c in hybrid.circuit_set(fabric, "ring-reverse"))


def reconfigure_request(fabric, request_id=None):
    request = {"op": "reconfigure", "ocs": "o1", "circuits": ring_reverse(fabric),
               "technology": "custom", "delay_ms": 0}
    if request_id is not None:
        request["request_id"] = request_id
    return request


def lightpath_batches(applier):
    return [i for batch in applier.batches for intents in batch.values() for i in intents
            if isinstance(i, Lightpath)]


def as_json(value):
    return json.loads(json.dumps(value))


@pytest.fixture
def served(tmp_path):
    fabric = registry.build(SPEC)
    applier = RecordingApplier(fabric)
    path = str(tmp_path / "controller.state")
    return fabric, applier, FabricService(fabric, applier, state_path=path), path


# ---------------------------------------------------------------- state file
def sample_state():
    state = statefile.ControllerState(
        circuits={"o1": [[1, 4], [2, 3]]},
        technology={"o1": {"name": "custom", "delay_ms": 2.5}},
        manual_down=[["s1", "s5"]], pins={"kv-3": ["h1", "s1", "h2"]})
    state.remember("reconfigure-7", {"dark_s": 0.001})
    return state


def test_a_saved_state_loads_back_the_same(tmp_path):
    path = str(tmp_path / "state.json")
    state = sample_state()
    statefile.save(path, state)
    loaded = statefile.load(path)
    assert loaded == state, f"round trip changed the state: saved {state}, loaded {loaded}"
    assert list(loaded.requests) == ["reconfigure-7"]


def test_saving_over_a_file_replaces_it_whole_and_leaves_no_temporary(tmp_path):
    path = str(tmp_path / "state.json")
    statefile.save(path, sample_state())
    newer = statefile.ControllerState(circuits={"o1": [[1, 2]]})
    statefile.save(path, newer)
    assert statefile.load(path) == newer
    assert sorted(os.listdir(tmp_path)) == ["state.json"], "no .tmp may be left behind"


def test_a_writer_dying_mid_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = str(tmp_path / "state.json")
    statefile.save(path, sample_state())

    def dies_half_way(data, stream):
        stream.write(json.dumps(data)[:10])
        raise KeyboardInterrupt("killed mid-write")
    monkeypatch.setattr(statefile.json, "dump", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        statefile.save(path, statefile.ControllerState(circuits={"o1": [[1, 2]]}))
    assert statefile.load(path) == sample_state(), \
        "a reader must see the previous state, never half of the new one"


def test_a_missing_state_file_is_no_state(tmp_path):
    assert statefile.load(str(tmp_path / "never-saved")) is None


@pytest.mark.parametrize("text", ["{not json", json.dumps({"version": 99}),
                                  json.dumps({"version": 1, "circuits": {}}),
                                  json.dumps({"version": 1, "circuits": {"o1": [[1]]},
                                              "technology": {}, "manual_down": [],
                                              "pins": {}, "requests": []})])
def test_a_malformed_state_file_is_an_error_naming_it(tmp_path, text):
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(statefile.StateFileError, match=str(path)):
        statefile.load(str(path))


def test_only_the_last_requests_are_remembered():
    state = statefile.ControllerState()
    for n in range(statefile.REQUESTS_KEPT + 5):
        state.remember(f"r{n}", {"n": n})
    assert len(state.requests) == statefile.REQUESTS_KEPT
    assert "r4" not in state.requests and "r5" in state.requests, "the oldest go first"
    state.remember("r5", {"n": 5})          # asked again: now the newest
    state.remember("new", {})
    assert "r5" in state.requests and "r6" not in state.requests


# ---------------------------------------------------------------- requests answered once
def test_a_request_id_asked_twice_is_carried_out_once(served):
    fabric, applier, service, _ = served
    assert "reconfigure" in CHANGING_OPS
    first = service.handle(reconfigure_request(fabric, "rc-1"))
    lit = lightpath_batches(applier)
    assert lit, "the first request must reconfigure"
    second = service.handle(reconfigure_request(fabric, "rc-1"))
    assert lightpath_batches(applier) == lit, "the retried request must change nothing"
    assert second == dict(first, replayed=True)
    assert "replayed" not in first


def test_a_request_without_an_id_or_with_another_runs_again(served):
    fabric, applier, service, _ = served
    service.handle({"op": "pin", "id": "p", "path": PIN_PATH, "request_id": "a"})
    service.handle({"op": "unpin", "id": "p", "request_id": "b"})
    again = service.handle({"op": "pin", "id": "p", "path": PIN_PATH, "request_id": "c"})
    assert "replayed" not in again and len(applier.batches) == 3


@pytest.mark.parametrize("bad", [7, "", ["x"]])
def test_a_request_id_that_is_not_a_string_is_refused(served, bad):
    fabric, applier, service, _ = served
    with pytest.raises(ValueError, match="request_id"):
        service.handle(reconfigure_request(fabric, bad))
    assert applier.batches == [], "a refused request changes nothing"


def test_the_state_file_holds_the_circuits_after_a_reconfigure(served):
    fabric, _, service, path = served
    service.handle(reconfigure_request(fabric, "rc-1"))
    saved = statefile.load(path)
    assert saved.circuits == {"o1": ring_reverse(fabric)}
    assert saved.technology == {"o1": {"name": "custom", "delay_ms": 0}}
    assert "rc-1" in saved.requests


def predecessor(served):
    """A controller that reconfigured, failed a link and pinned a pair, then died."""
    fabric, _, service, path = served
    service.handle(reconfigure_request(fabric, "rc-1"))
    service.handle({"op": "link", "u": "s2", "v": "h4", "up": False, "request_id": "ln-1"})
    service.handle({"op": "pin", "id": "kv", "path": PIN_PATH, "request_id": "pin-1"})
    return path


def successor(path):
    fabric = registry.build(SPEC)
    applier = RecordingApplier(fabric)
    service = FabricService(fabric, applier, state_path=path)
    take_over(service, path)
    return fabric, applier, service


def test_a_successor_takes_over_circuits_technology_links_and_pins(served):
    path = predecessor(served)
    old = served[2].state()
    fabric, applier, service = successor(path)
    assert fabric.circuits["o1"] == {tuple(c) for c in ring_reverse(fabric)}
    now = service.state()
    for key in ("circuits", "technology", "down_links", "pins"):
        assert as_json(now[key]) == as_json(old[key]), \
            f"{key}: the predecessor had {old[key]}, the successor {now[key]}"
    assert now["down_links"] == [["h4", "s2"]]
    assert service.manual_down == {frozenset(("s2", "h4"))}
    assert applier.batches == [], "taking over sends nothing before switches connect"


def test_a_successor_resyncs_each_switch_instead_of_resetting_it(served):
    fabric, _, service = successor(predecessor(served))
    ocs = service.start("o1")
    assert type(ocs[0]) is Resync and not any(isinstance(i, Reset) for i in ocs)
    lit = {port for c in ring_reverse(fabric) for port in c}
    assert ocs[0].dark_ports == tuple(sorted(set(fabric.ports_of("o1")) - lit)) == (2, 3), \
        "the dark ports are the OCS ports no lit circuit joins"
    assert {(i.a, i.b) for i in ocs[1:]} == {(1, 4)} and all(i.lit for i in ocs[1:])
    s1 = service.start("s1")
    assert type(s1[0]) is Resync and not any(isinstance(i, Reset) for i in s1)
    assert any(isinstance(i, Route) for i in s1)
    assert any(isinstance(i, PinHop) for i in s1), "the pin comes back after the resync"


def test_a_fresh_controller_resets(served):
    _, _, service, _ = served
    assert type(service.start("s1")[0]) is Reset
    assert type(service.start("o1")[0]) is Reset


def test_a_take_over_without_a_state_file_resyncs_the_fabrics_start(tmp_path):
    fabric, _, service = successor(str(tmp_path / "never-saved"))
    start = service.start("o1")
    assert type(start[0]) is Resync and start[0].dark_ports == (1, 4), \
        "the fabric's starting circuit (2, 3) is lit, the rest dark"


def test_a_request_the_predecessor_answered_is_replayed_not_applied(served):
    fabric0, _, service0, path = served
    first = service0.handle(reconfigure_request(fabric0, "rc-1"))
    fabric, applier, service = successor(path)
    again = service.handle(reconfigure_request(fabric, "rc-1"))
    assert applier.batches == [], "the successor must not carry out an answered request"
    assert again == dict(as_json(first), replayed=True)
    fresh = service.handle({"op": "preset", "ocs": "o1", "technology": "mems",
                            "request_id": "pr-1"})
    assert "replayed" not in fresh and statefile.load(path).technology["o1"]["name"] == "mems"
    assert set(statefile.load(path).requests) == {"rc-1", "pr-1"}, \
        "the successor keeps its predecessor's answers with its own"


# ---------------------------------------------------------------- Resync as OpenFlow
def on_the_wire(msgs):
    """Each message serialised, parsed back strictly (fakes.decode), with its bytes."""
    datapath = FakeDatapath(1, "dut")
    wire = []
    for xid, msg in enumerate(msgs, 1):
        msg.datapath = datapath
        msg.set_xid(xid)
        msg.serialize()
        buf = bytes(msg.buf)
        wire.append((decode(datapath, buf), buf))
    return wire


def test_a_packet_switch_resync_replaces_in_place_without_deleting_all(served):
    fabric, _, service = successor(predecessor(served))
    network = FakeNetwork(fabric)
    wire = on_the_wire(network.messages("s1", service.start("s1")))
    msgs = [m for m, _ in wire]
    for msg in msgs:
        assert not (isinstance(msg, parser.OFPFlowMod) and msg.table_id == ofp.OFPTT_ALL), \
            "a resync must not delete every flow: the switch keeps forwarding"
        assert not (isinstance(msg, parser.OFPGroupMod) and msg.command == ofp.OFPGC_DELETE), \
            "nor every group"
    miss, pins = msgs[0], msgs[1]
    assert miss.command == ofp.OFPFC_ADD and miss.priority == 0 and not miss.instructions
    assert pins.command == ofp.OFPFC_DELETE and pins.cookie == ofmsg.COOKIE_PIN \
        and pins.cookie_mask == ofmsg.COOKIE_PIN_MASK, "every pin flow, by cookie tag"
    route_flows = [m for m in msgs if isinstance(m, parser.OFPFlowMod)
                   and m.priority == ofmsg.PRIORITY_ROUTE]
    assert route_flows and (route_flows[0].cookie & ofmsg.COOKIE_PIN_MASK) != \
        ofmsg.COOKIE_PIN, "the pin delete must spare the route flows"
    groups = [(i, m, buf) for i, (m, buf) in enumerate(wire) if isinstance(m, parser.OFPGroupMod)]
    assert len(groups) == len(fabric.hosts)
    for index, group, buf in groups:
        assert struct.unpack_from("!H", buf, ofp.OFP_HEADER_SIZE)[0] == 0x8000, \
            "a resync's group is OFPGC_ADD_OR_MOD (Open vSwitch's --may-create)"
        flow = msgs[index + 1]
        assert isinstance(flow, parser.OFPFlowMod) and flow.command == ofp.OFPFC_ADD
        actions = flow.instructions[0].actions
        assert actions[0].group_id == group.group_id, "the route flow follows its group"
    pin_adds = [m for m in msgs if isinstance(m, parser.OFPFlowMod)
                and m.priority == ofmsg.PRIORITY_PIN]
    assert pin_adds and msgs.index(pin_adds[0]) > 1, "the pin comes back after its delete"


def test_an_ocs_resync_deletes_its_dark_ports_and_relights_its_circuits():
    fabric = registry.build(SPEC)
    intents = [Resync("o1", (2, 3)), Lightpath("o1", 1, 4, True)]
    msgs = [m for m, _ in on_the_wire(FakeNetwork(fabric).messages("o1", intents))]
    assert msgs[0].command == ofp.OFPFC_ADD and msgs[0].priority == 0
    deletes = [m for m in msgs if m.command in (ofp.OFPFC_DELETE, ofp.OFPFC_DELETE_STRICT)]
    assert all(m.command == ofp.OFPFC_DELETE_STRICT for m in deletes), \
        "an OCS resync deletes nothing but the dark ports' circuits"
    assert sorted(dict(m.match.items())["in_port"] for m in deletes) == [2, 3]
    assert all(m.priority == ofmsg.PRIORITY_CIRCUIT for m in deletes)
    adds = {(dict(m.match.items())["in_port"], m.instructions[0].actions[0].port)
            for m in msgs[1:] if m.command == ofp.OFPFC_ADD}
    assert adds == {(1, 4), (4, 1)}
    assert not any(isinstance(m, parser.OFPGroupMod) for m in msgs)


def test_a_reset_still_deletes_everything():
    fabric = registry.build(SPEC)
    msgs = FakeNetwork(fabric).messages("s1", [Reset("s1")])
    assert msgs[0].table_id == ofp.OFPTT_ALL and msgs[0].command == ofp.OFPFC_DELETE
    assert msgs[1].group_id == ofp.OFPG_ALL and msgs[1].command == ofp.OFPGC_DELETE


# ---------------------------------------------------------------- Resync in the kernel
def test_a_router_resync_keeps_its_routes_while_a_reset_deletes_them():
    fabric = registry.build("hybrid,tors=3")
    kernel = FakeKernel(fabric)
    sock = kernel.sockets["s1"]
    applier = NetlinkApplier(fabric)
    service = FabricService(fabric, applier)
    applier.attach("s1", sock)
    applier.start("s1", service.start("s1"))
    ours = {key for key in sock.routes}
    assert len(ours) == len(fabric.hosts)
    sock.calls.clear()
    applier.apply({"s1": [Resync("s1")]})
    assert set(sock.routes) == ours, "a resync must not delete a route"
    assert not [c for c in sock.calls if c[:2] == ("route", "del")]
    applier.apply({"s1": [Reset("s1")]})
    assert not sock.routes, "a reset deletes the fabric's routes"


# ---------------------------------------------------------------- pause points
def test_pause_at_returns_at_once_unless_the_point_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(pause.PAUSE_AT, raising=False)
    monkeypatch.setenv(pause.PAUSE_DIR, str(tmp_path))
    pause.pause_at("ocs-dark")
    monkeypatch.setenv(pause.PAUSE_AT, "teardown")
    pause.pause_at("ocs-dark")
    assert os.listdir(tmp_path) == []


def test_pause_at_waits_for_go_once(tmp_path, monkeypatch):
    monkeypatch.setenv(pause.PAUSE_AT, "build,ocs-dark")
    monkeypatch.setenv(pause.PAUSE_DIR, str(tmp_path))
    paused = threading.Thread(target=pause.pause_at, args=("ocs-dark",), daemon=True)
    paused.start()
    reached = tmp_path / "ocs-dark.reached"
    assert wait_for(reached.exists), "the point must be announced"
    assert wait_for(lambda: reached.read_text() == str(os.getpid()))
    time.sleep(0.1)
    assert paused.is_alive(), "it must wait for the go"
    (tmp_path / "ocs-dark.go").touch()
    paused.join(5)
    assert not paused.is_alive(), "the go must release it"
    (tmp_path / "ocs-dark.go").unlink()
    started = time.monotonic()
    pause.pause_at("ocs-dark")
    assert time.monotonic() - started < 0.5, "a point pauses once"


# ---------------------------------------------------------------- deferred signals
class Interrupted(Exception):
    pass


def test_a_signal_inside_deferred_is_raised_after_the_block():
    def raise_interrupted(signum, frame):
        raise Interrupted(signum)
    before = signal.signal(signal.SIGUSR2, raise_interrupted)
    finished_inside = False
    try:
        with pytest.raises(Interrupted):
            with deferred(signals=(signal.SIGUSR2,)) as held:
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(0.05)
                assert held == [signal.SIGUSR2]
                finished_inside = True
        assert finished_inside, "the block must run to its end"
        assert signal.getsignal(signal.SIGUSR2) is raise_interrupted
    finally:
        signal.signal(signal.SIGUSR2, before)


# ---------------------------------------------------------------- result file
def test_write_result_is_whole_and_leaves_no_temporary(tmp_path):
    results.write_result(tmp_path, {"status": "running"})
    path = results.write_result(tmp_path, {"status": "ok", "flows": [1, 2]})
    assert json.loads(path.read_text()) == {"status": "ok", "flows": [1, 2]}
    assert os.listdir(tmp_path) == ["result.json"], "no .result.json.tmp left behind"
