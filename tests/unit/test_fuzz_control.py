"""Hostile control-channel messages: the controller (`controllers.control.ControlServer`
answering through `controllers.service.FabricService`, over a recording applier
as in test_controllers) replies to every line with ``{"ok": false, "error": ...}``
naming what is wrong, changes nothing it refused, and still answers ``status``
afterwards."""

from __future__ import annotations

import inspect
import json
import math
import re
import socket

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from controllers.control import ControlServer
from controllers.ocs_core import TECHNOLOGIES
from controllers.service import OPS, FabricService
from fakes import RecordingApplier
from fuzzing import assert_clear, hostile_text, json_values, share
from topologies.registry import build

# Two ToRs joined through one OCS (o1, ports 1-4) and two hosts each.
SPEC = "hybrid"
# The dark window of a reconfiguration is slept through: time runs a thousand
# times faster here (a robotic OCS's 120 s is 0.12 s).
TDF = 0.001
NAMES = ["h1", "h2", "h3", "h4", "s1", "s2", "o1", "o2", "", "H1", "s1 ", "fes1"]
TECHNOLOGY_NAMES = list(TECHNOLOGIES) + ["custom", "Custom", "", "mems "]


def new_service() -> FabricService:
    fabric = build(SPEC)
    return FabricService(fabric, RecordingApplier(fabric), tdf=TDF)


def snapshot(service: FabricService) -> str:
    """What a refused request must not change: circuits, technologies, links, pins."""
    return json.dumps(service.state(), sort_keys=True, default=str)


# ------------------------------------------------------------ requests that look right
# Each op's own argument names, with values near what they take, and now and
# then any JSON at all; numbers stay small where the controller sleeps on them.
delays = (st.floats(0, 1000) | st.integers(-5, 1000)
          | st.sampled_from([math.nan, math.inf, -math.inf, -0.0, -1e-9, "10", None, True]))
circuit_lists = st.lists(st.lists(st.integers(-1, 6) | st.sampled_from(["1", 1.5, None, True]),
                                  max_size=3), max_size=3)
ARGUMENTS = {
    "ocs": st.sampled_from(NAMES), "u": st.sampled_from(NAMES), "v": st.sampled_from(NAMES),
    "circuits": circuit_lists, "delay_ms": delays,
    "technology": st.sampled_from(TECHNOLOGY_NAMES),
    "up": st.booleans() | st.sampled_from(["false", "true", 0, 1, None, "no"]),
    "id": st.sampled_from(["p1", "p2", "", 7, None]),
    "path": st.lists(st.sampled_from(NAMES), max_size=5),
    "flows": st.lists(st.lists(st.sampled_from(NAMES) | st.integers(-1, 70000), max_size=5),
                      max_size=3),
    "schedule": json_values, "start_in_s": delays, "stop": st.booleans(),
    "request_id": st.sampled_from(["r1", "", 5, None]),
}


# Any JSON, but no number the controller would sleep on for long (a long dark
# window is a valid request, and a slow test).
short_json = json_values.filter(lambda value: not isinstance(value, (int, float))
                                or isinstance(value, bool) or not value > 1000)


# Requests the controller carries out, for a start: the fuzzing then changes an
# argument of one now and then, so that what is accepted is tried as often as
# what is refused.
LINKS = [("s1", "h1"), ("s1", "h2"), ("s2", "h3"), ("o1", "s1"), ("o1", "s2")]
VALID = {
    "link": st.tuples(st.sampled_from(LINKS), st.booleans()).map(
        lambda link: {"u": link[0][0], "v": link[0][1], "up": link[1]}),
    "reconfigure": st.tuples(st.sampled_from([[[1, 4], [2, 3]], [[2, 3]], [], [[1, 2], [3, 4]]]),
                             st.none() | st.floats(0, 50)).map(
        lambda plan: {"ocs": "o1", "circuits": plan[0], "delay_ms": plan[1]}),
    "preset": st.sampled_from(list(TECHNOLOGIES)).map(
        lambda name: {"ocs": "o1", "technology": name}),
    "pin": st.sampled_from([["h1", "s1", "h2"], ["h3", "s2", "h4"]]).map(
        lambda path: {"id": "p1", "path": path}),
    "unpin": st.just({"id": "p1"}),
}


@st.composite
def requests(draw):
    op = draw(st.sampled_from(OPS + ("nope", "", "STATUS")) | st.sampled_from(sorted(VALID)))
    request = {"op": op}
    if op in VALID and draw(st.booleans()):
        request.update(draw(VALID[op]))
        keys = draw(st.lists(st.sampled_from(sorted(ARGUMENTS)), max_size=1))
    else:
        keys = draw(st.lists(st.sampled_from(sorted(ARGUMENTS)), max_size=4, unique=True))
    for key in keys:
        request[key] = draw(ARGUMENTS[key] if draw(st.integers(0, 4)) else short_json)
    if draw(st.integers(0, 9)) == 0:
        request[draw(hostile_text)] = draw(json_values)
    return request


# Answered by the server (the connection turns into a stream of events).
STREAMING = {"watch"}


@share(2.0)
@given(st.lists(requests(), min_size=1, max_size=4))
def test_a_refused_request_is_explained_and_changes_nothing(sequence):
    service = new_service()
    for request in sequence:
        if request["op"] in STREAMING:
            continue
        before = snapshot(service)
        try:
            service.handle(request)
            event(f"accepted {request['op']}")
            assert_took_its_own_types(request)
        except Exception as exc:        # the server replies with it; see the wire test
            event(f"refused {request['op']}: {type(exc).__name__}")
            message = f"{type(exc).__name__}: {exc}"
            assert_clear(message)
            assert not isinstance(exc, (KeyError, IndexError, AttributeError, AssertionError,
                                        UnboundLocalError, RecursionError)), \
                f"{request}: a {message!r} says nothing of the request"
            assert snapshot(service) == before, f"{request} was refused ({message}) but " \
                                                "changed the controller's state"
    assert service.status()["ready"]


def assert_took_its_own_types(request: dict) -> None:
    """What an accepted request carried is what its op means: no "false" for
    false, no 1.5 or "1" for a port."""
    op = request["op"]
    if op == "link":
        assert isinstance(request["up"], bool), f"{request} accepted"
    if op == "reconfigure":
        for pair in request["circuits"]:
            assert all(type(port) is int for port in pair), f"{request} accepted"
    if op in ("reconfigure", "preset") and request.get("delay_ms") is not None:
        assert math.isfinite(request["delay_ms"]), f"{request} accepted"


# ------------------------------------------------------------ the bugs it found
def test_a_nan_delay_is_refused_before_anything_goes_dark():
    """It passed `delay_ms < 0`, and the dark window's wait spun for ever,
    holding the reconfiguration lock: every later change waited."""
    service = new_service()
    before = snapshot(service)
    for delay in (math.nan, math.inf, "10", True):
        with pytest.raises(ValueError, match="delay_ms"):
            service.handle({"op": "reconfigure", "ocs": "o1", "circuits": [[1, 4]],
                            "delay_ms": delay})
        with pytest.raises(ValueError, match="delay_ms"):
            service.handle({"op": "preset", "ocs": "o1", "technology": "custom",
                            "delay_ms": delay})
    assert snapshot(service) == before
    assert not service.applier.batches, "a refused reconfiguration reached the switches"


def test_a_dark_window_too_long_to_sleep_is_refused_before_the_tear():
    """1e300 ms failed in time.sleep with an OverflowError, circuits torn."""
    service = new_service()
    before = snapshot(service)
    with pytest.raises(ValueError, match=r"o1: delay_ms=1e\+300 at tdf 0.001 is a dark window"):
        service.handle({"op": "reconfigure", "ocs": "o1", "circuits": [[1, 4]],
                        "delay_ms": 1e300})
    assert snapshot(service) == before and not service.applier.batches


def test_a_link_state_that_is_no_boolean_is_refused():
    """"up": "false" is a non-empty string, so true: it brought the link up."""
    service = new_service()
    service.handle({"op": "link", "u": "s1", "v": "h1", "up": False})
    down = snapshot(service)
    for value in ("false", "true", 0, 1, None):
        with pytest.raises(ValueError, match=f"op 'link': argument 'up' must be true or false, "
                                             f"got {re.escape(repr(value))}"):
            service.handle({"op": "link", "u": "s1", "v": "h1", "up": value})
    assert snapshot(service) == down


@pytest.mark.parametrize("circuits, message", [
    ([[1.5, 3]], "port 1.5 is not an integer"),          # was lit as 1-3
    ([["1", 4]], "port '1' is not an integer"),          # was lit as 1-4
    ([[True, 4]], "port True is not an integer"),        # was lit as 1-4
    (["14"], "circuit '14' on o1 is not a port pair"),   # was read as ports 1 and 4
    ([7], "circuit 7 on o1 is not a port pair"),         # was "'int' object is not iterable"
    ("1-4", "circuits on o1 must be a list of port pairs"),
    ({"1": 4}, "circuits on o1 must be a list of port pairs"),
])
def test_circuits_that_are_not_port_pairs_of_integers_are_refused(circuits, message):
    service = new_service()
    before = snapshot(service)
    with pytest.raises(ValueError, match=re.escape(message)):
        service.handle({"op": "reconfigure", "ocs": "o1", "circuits": circuits})
    assert snapshot(service) == before and not service.applier.batches


@pytest.mark.parametrize("request_, message", [
    ({"op": "link", "v": "s2", "up": True}, "op 'link': missing argument 'u'"),
    ({"op": "unpin", "pin": "p1"}, "op 'unpin': unknown argument 'pin'; allowed: id"),
    ({"op": "reconfigure", "ocs": ["o1"], "circuits": []},
     "op 'reconfigure': argument 'ocs' must be a string, got ['o1']"),
    ({"op": "pin", "id": "p1", "path": "h1 s1 h2"},
     "op 'pin': argument 'path' must be a list, got 'h1 s1 h2'"),
    ({"op": "schedule", "stop": "false"}, "op 'schedule': argument 'stop' must be true or false"),
    ({"op": "schedule", "schedule": {}, "start_in_s": math.nan},
     "argument 'start_in_s' must be a finite number, got nan"),
])
def test_arguments_are_checked_against_the_op_and_named(request_, message):
    """Python's own "do_link() missing 2 required positional arguments", or a
    TypeError about hashing, named neither the op nor what the client sent."""
    with pytest.raises(ValueError, match=re.escape(message)):
        new_service().handle(request_)


# ------------------------------------------------------------ bytes on the wire
@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    """One controller for every example: garbage must not wear it down either."""
    service = new_service()
    server = ControlServer(str(tmp_path_factory.mktemp("control") / "control.sock"),
                           service.handle)
    server.start()
    yield server
    server.stop()


def exchange(path: str, payload: bytes) -> list:
    """Send ``payload`` on a new connection, then a status request; every reply line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(path)
        sock.sendall(payload + b"\n" + json.dumps({"op": "status"}).encode() + b"\n")
        sock.shutdown(socket.SHUT_WR)
        with sock.makefile("rb") as stream:
            return [json.loads(line) for line in stream]


def lines_for(request: dict) -> bytes:
    return json.dumps(request).encode()


wire_payloads = st.one_of(
    st.binary(max_size=300).map(lambda data: data.replace(b"\n", b" ")),
    json_values.map(lambda value: json.dumps(value).encode()),
    requests().filter(lambda r: r["op"] not in STREAMING).map(lines_for),
    st.sampled_from([b"", b"{", b"\xff\xfe", b"[]", b'{"op": null}', b'{"op": ["status"]}',
                     b'{"op": {"a": 1}}', b"NaN", b'{"op": "status", "op": "link"}',
                     b'{"op": "reconfigure", "ocs": "o1", "circuits": [[1, 4]], '
                     b'"delay_ms": NaN}', b"\x00" * 64]))


@share(2.0)
@given(wire_payloads)
def test_every_line_gets_a_json_reply_and_status_still_answers(controller, payload):
    replies = exchange(controller.path, payload)
    status = replies[-1]
    assert status.get("ok") is True and status.get("ready") is True, \
        f"after {payload[:80]!r} the controller answered status with {status}"
    for reply in replies[:-1]:
        assert isinstance(reply.get("ok"), bool), reply
        if not reply["ok"]:
            assert_clear(reply["error"])
    event(f"replies {len(replies) - 1}")


def test_a_watch_after_garbage_still_streams(controller):
    """The event stream is a connection of its own: garbage before does not stop it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(controller.path)
        sock.sendall(b"\xff garbage\n" + json.dumps({"op": "watch"}).encode() + b"\n")
        with sock.makefile("rb") as stream:
            assert json.loads(stream.readline())["ok"] is False
            assert json.loads(stream.readline()) == {"ok": True, "watching": True}


def test_every_op_is_fuzzed_with_its_own_arguments():
    """A new op, or a new argument of one, needs a strategy in ARGUMENTS."""
    service = new_service()
    for op in OPS:
        method = getattr(service, f"do_{op}", None) or getattr(service, op, None)
        if method is None or op in STREAMING:
            continue
        for name in inspect.signature(method).parameters:
            assert name in ARGUMENTS, f"op {op!r}: argument {name!r} is not fuzzed"
