"""The controller's live events: the hub that hands them out without waiting, what
the service publishes, and the watch from the control channel to `ControllerWatch`."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from typing import Callable, List

import pytest
from fakes import RecordingApplier

from controllers.control import ControlClient, ControlError, ControlServer
from controllers.eventhub import EventHub
from controllers.service import FabricService
from emu.live.watch import ControllerWatch
from topologies import hybrid, registry

WAIT_S = 5.0
CIRCUIT_STEPS = ["start", "dark", "lit", "done"]


class Collector:
    """Events as a subscriber gets them; ``until`` waits for a condition on them."""

    def __init__(self):
        self.events: List[dict] = []
        self._changed = threading.Condition()

    def __call__(self, event: dict) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def until(self, condition: Callable[[List[dict]], bool], what: str) -> List[dict]:
        with self._changed:
            if not self._changed.wait_for(lambda: condition(self.events), WAIT_S):
                raise AssertionError(f"no {what} within {WAIT_S} s; got {self.events}")
            return list(self.events)

    def of_kind(self, kind: str) -> List[dict]:
        with self._changed:
            return [event for event in self.events if event["kind"] == kind]


def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {WAIT_S} s")
        time.sleep(0.005)


def service(tdf: float = 1.0, applier_class=RecordingApplier) -> FabricService:
    fabric = registry.build("hybrid,tors=4,hosts_per_tor=1")
    return FabricService(fabric, applier_class(fabric), tdf=tdf)


def ring_reverse(svc: FabricService) -> list:
    return sorted(hybrid.circuit_set(svc.fabric, "ring-reverse"))


# ---------------------------------------------------------------- the hub
def test_every_subscriber_gets_every_event_in_order():
    hub = EventHub()
    first, second = Collector(), Collector()
    hub.subscribe(first)
    unsubscribe = hub.subscribe(second)
    for n in range(5):
        hub.publish({"kind": "n", "n": n})
    for collector in (first, second):
        events = collector.until(lambda seen: len(seen) == 5, "five events")
        assert [event["n"] for event in events] == list(range(5))
    unsubscribe()
    hub.publish({"kind": "n", "n": 5})
    first.until(lambda seen: len(seen) == 6, "the sixth event")
    assert len(second.events) == 5, "an unsubscribed callback hears nothing more"
    assert hub.subscribers == 1


def test_a_subscriber_that_never_returns_delays_no_publish_and_loses_its_oldest():
    hub = EventHub(queue_size=4)
    release, entered = threading.Event(), threading.Event()
    stuck = Collector()

    def never_returns(event):
        entered.set()
        release.wait(WAIT_S)
        stuck(event)

    hub.subscribe(never_returns)
    hub.publish({"kind": "n", "n": 0})
    assert entered.wait(WAIT_S), "its thread took the first event and is stuck in it"
    started = time.monotonic()
    for n in range(1, 1001):
        hub.publish({"kind": "n", "n": n})
    assert time.monotonic() - started < 0.5, "a thousand publishes waited for a subscriber"
    assert hub.dropped == 1000 - 4, "a queue of four kept the newest four"
    release.set()
    events = stuck.until(lambda seen: len(seen) == 6, "the rest of the queue")
    assert events[0]["n"] == 0
    assert events[1]["kind"] == "dropped" and events[1]["count"] == 996
    assert [event["n"] for event in events[2:]] == [997, 998, 999, 1000]


def test_a_callback_that_raises_is_unsubscribed_and_the_others_go_on():
    hub = EventHub()
    healthy = Collector()
    failed = threading.Event()

    def broken(event):
        failed.set()
        raise RuntimeError("a watcher's bug")

    hub.subscribe(broken)
    hub.subscribe(healthy)
    hub.publish({"kind": "a"})
    assert failed.wait(WAIT_S)
    eventually(lambda: hub.subscribers == 1, "the broken subscriber removed")
    hub.publish({"kind": "b"})
    assert [e["kind"] for e in healthy.until(lambda seen: len(seen) == 2, "both")] == ["a", "b"]


# ---------------------------------------------------------------- what the service publishes
def test_a_reconfiguration_publishes_its_four_steps_as_circuit_events():
    svc = service(tdf=2.0)
    heard = Collector()
    svc.events.subscribe(heard)
    result = svc.do_reconfigure("o1", ring_reverse(svc), delay_ms=0.5, technology="custom")
    events = heard.until(lambda seen: len(seen) == 4, "the four steps")
    assert [event["step"] for event in events] == CIRCUIT_STEPS
    assert all(event["kind"] == "circuit" and event["ocs"] == "o1"
               and event["technology"] == "custom" for event in events), events
    times = [event["t"] for event in events]
    assert times == sorted(times) and all(isinstance(t, float) for t in times)
    start, dark, lit, done = events
    plan = result["plan"]
    assert start["tear"] == [list(c) for c in plan["tear"]] and start["tear"]
    assert start["light"] == [list(c) for c in plan["light"]] and start["light"]
    assert start["keep"] == [list(c) for c in plan["keep"]]
    assert start["delay_ms"] == pytest.approx(1.0), "0.5 ms at tdf 2: emulated"
    assert dark["t"] == result["dark_from"]
    assert dark["dark_until"] == pytest.approx(result["dark_from"] + 0.001)
    assert lit["t"] == result["timestamps"]["lit"] and lit["light"] == start["light"]
    assert done["t"] == result["timestamps"]["routes_restored"]
    assert done["dark_s"] == result["dark_s"]


class FailingLight(RecordingApplier):
    """Refuses the batch that lights circuits."""

    def apply(self, batch):
        super().apply(batch)
        if any(getattr(i, "lit", False) for intents in batch.values() for i in intents):
            raise RuntimeError("the OCS refused")


def test_a_reconfiguration_that_fails_says_so_instead_of_done():
    svc = service(applier_class=FailingLight)
    heard = Collector()
    svc.events.subscribe(heard)
    with pytest.raises(RuntimeError, match="the OCS refused"):
        svc.do_reconfigure("o1", ring_reverse(svc), delay_ms=0.0, technology="custom")
    events = heard.until(lambda seen: seen and seen[-1]["step"] == "failed", "a failed step")
    assert [event["step"] for event in events] == ["start", "dark", "failed"]
    assert events[-1]["error"] == "RuntimeError: the OCS refused"
    assert isinstance(events[-1]["t"], float)


def test_a_link_change_is_published_once_rerouted_and_only_if_it_changed():
    svc = service()
    journal = []
    svc.events.publish = lambda event: journal.append(("event", event))
    apply = svc.applier.apply
    svc.applier.apply = lambda batch: (journal.append(("apply", sorted(batch))), apply(batch))
    svc.do_link("s1", "o1", up=False)
    assert [entry[0] for entry in journal] == ["apply", "event"], "published after the reroute"
    event = journal[-1][1]
    assert {k: v for k, v in event.items() if k != "t"} == \
        {"kind": "link", "a": "o1", "b": "s1", "up": False}
    assert isinstance(event["t"], float)
    journal.clear()
    svc.do_link("s1", "o1", up=False)
    assert [entry[0] for entry in journal] == ["apply"], "already down: nothing to announce"
    svc.do_link("o1", "s1", up=True)
    assert journal[-1][1]["up"] is True


def test_links_that_fail_together_are_one_event_each():
    svc = service()
    heard = Collector()
    svc.events.subscribe(heard)
    reports = [(switch, port, False) for switch in ("s1", "s2")
               for port in svc.fabric.ports_of(switch)
               if svc.fabric.ports_of(switch)[port][0] == "o1"]
    svc.ports_changed(reports)
    events = heard.until(lambda seen: len(seen) == 2, "two link events")
    assert sorted((e["a"], e["b"], e["up"]) for e in events) == \
        [("o1", "s1", False), ("o1", "s2", False)]
    assert events[0]["t"] == events[1]["t"], "one reroute for both"


def test_a_preset_is_published_with_its_emulated_delay():
    svc = service(tdf=4.0)
    heard = Collector()
    svc.events.subscribe(heard)
    svc.do_preset("o1", "mems")
    (event,) = heard.until(lambda seen: len(seen) == 1, "the preset")
    assert {k: v for k, v in event.items() if k != "t"} == \
        {"kind": "preset", "ocs": "o1", "technology": "mems", "delay_ms": 40.0}


def test_watch_is_an_op_the_service_lists():
    with pytest.raises(ValueError, match=r"allowed: .*\bwatch\b"):
        service().handle({"op": "nope"})


# ---------------------------------------------------------------- over the control channel
@pytest.fixture
def controller(tmp_path):
    svc = service()
    server = ControlServer(str(tmp_path / "run" / "control.sock"), svc.handle)
    server.start()
    yield svc, server
    server.stop()


def test_a_watch_streams_the_services_events_to_controller_watch(controller):
    svc, server = controller
    heard = Collector()
    watch = ControllerWatch(server.path, heard).start()
    try:
        assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
        # No wait here: what is published once start() returned must arrive.
        svc.do_preset("o1", "piezo")
        svc.do_reconfigure("o1", ring_reverse(svc), delay_ms=0.0, technology="custom")
        svc.do_link("s1", "o1", up=False)
        events = heard.until(lambda seen: len(seen) == 6, "six events")
        assert [(e["kind"], e.get("step")) for e in events] == \
            [("preset", None)] + [("circuit", step) for step in CIRCUIT_STEPS] + \
            [("link", None)]
        assert events[1]["light"] and all(isinstance(p, int) for p in events[1]["light"][0])
        client = ControlClient(server.path, timeout=5)
        try:
            assert client.call("state")["down_links"] == [["o1", "s1"]], \
                "request and reply work beside the watch"
        finally:
            client.close()
        assert watch.running and watch.error is None and watch.received == 6
    finally:
        watch.stop()
    assert not watch.running
    eventually(lambda: svc.events.subscribers == 0, "the closed watch unsubscribed")


def test_controller_watch_ends_quietly_when_the_controller_stops(controller):
    svc, server = controller
    heard = Collector()
    watch = ControllerWatch(server.path, heard).start()
    server.stop()
    eventually(lambda: not watch.running, "the reader thread ending with the channel")
    assert watch.error == "the controller closed the channel"
    started = time.monotonic()
    watch.stop()
    assert time.monotonic() - started < 1.0
    assert svc.events.subscribers == 0


def test_a_watcher_that_never_reads_never_slows_the_controller(controller):
    """A client that asked to watch and then reads nothing: its socket fills, its
    queue drops its oldest events, and reconfigurations take no longer."""
    svc, server = controller
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(server.path)
    try:
        sock.sendall(b'{"op": "watch"}\n')
        eventually(lambda: svc.events.subscribers == 1, "the watch subscribed")
        started = time.monotonic()
        for n in range(3000):      # about 30 MB of events: far more than any socket buffers
            svc.events.publish({"kind": "bulk", "n": n, "data": "x" * 10000})
        svc.do_reconfigure("o1", ring_reverse(svc), delay_ms=0.0, technology="custom")
        assert time.monotonic() - started < 2.0, "publishing waited for the watcher"
        eventually(lambda: svc.events.dropped > 0, "the stuck watcher losing events")
    finally:
        sock.close()
    eventually(lambda: svc.events.subscribers == 0, "the watch unsubscribed on close")


def test_controller_watch_reports_a_controller_it_cannot_watch(tmp_path):
    with pytest.raises(ControlError, match="cannot watch the controller"):
        ControllerWatch(str(tmp_path / "absent.sock"), lambda event: None).start()
    server = ControlServer(str(tmp_path / "old.sock"),
                           lambda request: (_ for _ in ()).throw(ValueError("unknown op")))
    server.start()
    try:
        with pytest.raises(ControlError, match="refused 'watch': ValueError: unknown op"):
            ControllerWatch(server.path, lambda event: None).start()
    finally:
        server.stop()


def test_an_on_event_that_raises_does_not_end_the_watch(controller):
    svc, server = controller
    heard = Collector()

    def picky(event):
        if event["kind"] == "preset":
            raise KeyError("the view cannot draw this")
        heard(event)

    watch = ControllerWatch(server.path, picky).start()
    try:
        svc.do_preset("o1", "mems")
        svc.do_link("s1", "o1", up=False)
        (event,) = heard.until(lambda seen: len(seen) == 1, "the link event")
        assert event["kind"] == "link" and watch.running
    finally:
        watch.stop()
