"""The runner's control channel: JSON lines over a 0600 Unix socket."""

import json
import os
import socket
import stat
import threading
import time

import pytest

from controllers.control import ControlClient, ControlError, ControlServer, Watch


def echo_handler(request):
    op = request["op"]
    if op == "echo":
        return {"echo": {k: v for k, v in request.items() if k != "op"}}
    if op == "boom":
        raise RuntimeError("the handler blew up")
    raise ValueError(f"unknown op {op!r}; allowed: echo, boom")


@pytest.fixture
def server(tmp_path):
    control = ControlServer(str(tmp_path / "run" / "control.sock"), echo_handler)
    control.start()
    yield control
    control.stop()


@pytest.fixture
def client(server):
    control = ControlClient(server.path, timeout=5)
    yield control
    control.close()


def raw_exchange(path, payload: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(payload)
        with sock.makefile("rb") as stream:
            line = stream.readline()
    assert line, f"no reply to {payload!r}"
    return json.loads(line)


def test_socket_is_private_to_its_owner(server):
    mode = stat.S_IMODE(os.stat(server.path).st_mode)
    assert stat.S_ISSOCK(os.stat(server.path).st_mode)
    assert mode == 0o600, f"control socket mode is {mode:o}, expected 600"
    directory = stat.S_IMODE(os.stat(os.path.dirname(server.path)).st_mode)
    assert directory == 0o700, f"socket directory mode is {directory:o}, expected 700"


def test_start_replaces_a_stale_socket_file(tmp_path):
    path = tmp_path / "control.sock"
    path.write_text("left over by a crashed controller")
    control = ControlServer(str(path), echo_handler)
    control.start()
    client = ControlClient(str(path), timeout=5)
    try:
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert client.call("echo", n=1) == {"echo": {"n": 1}}
    finally:
        client.close()
        control.stop()


def test_request_round_trips(client):
    reply = client.call("echo", ocs="o1", circuits=[[1, 4], [2, 3]], delay_ms=2.5)
    assert reply == {"echo": {"ocs": "o1", "circuits": [[1, 4], [2, 3]], "delay_ms": 2.5}}, \
        f"the reply must carry the handler's result without 'ok': {reply}"


def test_unknown_op_is_refused_with_the_handlers_message_and_the_channel_lives(client):
    with pytest.raises(ControlError, match=r"controller refused 'nope': ValueError: "
                                           r"unknown op 'nope'; allowed: echo, boom"):
        client.call("nope")
    assert client.call("echo", after="refusal") == {"echo": {"after": "refusal"}}


def test_handler_exception_is_reported_and_the_channel_lives(client):
    with pytest.raises(ControlError, match="RuntimeError: the handler blew up"):
        client.call("boom")
    with pytest.raises(ControlError, match="the handler blew up"):
        client.call("boom")
    assert client.call("echo", x=1) == {"echo": {"x": 1}}


@pytest.mark.parametrize("payload,message", [
    (b"this is not json\n", "JSONDecodeError"),
    (b"[1, 2]\n", "a request is a JSON object with an 'op'"),
    (b'{"no_op": true}\n', "a request is a JSON object with an 'op'"),
    (b"\xff\xfe\n", "UnicodeDecodeError"),
])
def test_malformed_line_gets_an_error_reply(server, payload, message):
    reply = raw_exchange(server.path, payload)
    assert reply["ok"] is False and message in reply["error"], \
        f"expected an error naming {message!r}, got {reply}"


def test_malformed_line_does_not_end_the_connection(server):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(server.path)
        with sock.makefile("rwb") as stream:
            stream.write(b"{broken\n" + json.dumps({"op": "echo", "k": 2}).encode() + b"\n")
            stream.flush()
            first, second = json.loads(stream.readline()), json.loads(stream.readline())
    assert first["ok"] is False
    assert second == {"ok": True, "echo": {"k": 2}}


def test_several_clients_are_served_at_once(server):
    one, two = ControlClient(server.path, timeout=5), ControlClient(server.path, timeout=5)
    try:
        assert one.call("echo", who=1) == {"echo": {"who": 1}}
        assert two.call("echo", who=2) == {"echo": {"who": 2}}
        assert one.call("echo", who=3) == {"echo": {"who": 3}}
    finally:
        one.close()
        two.close()


def test_unreachable_controller_is_a_control_error(tmp_path):
    client = ControlClient(str(tmp_path / "absent.sock"), timeout=1)
    with pytest.raises(ControlError, match="controller not reachable at .*absent.sock"):
        client.call("echo")


def test_stop_removes_the_socket_and_clients_see_a_control_error(tmp_path):
    control = ControlServer(str(tmp_path / "c.sock"), echo_handler)
    control.start()
    client = ControlClient(control.path, timeout=2)
    assert client.call("echo") == {"echo": {}}
    control.stop()
    assert not os.path.exists(control.path), "stop() must remove the socket file"
    client.close()
    with pytest.raises(ControlError, match="not reachable"):
        client.call("echo")


def test_threads_sharing_one_client_each_get_their_own_reply(server):
    """Requests from several threads take turns on the one connection."""
    import threading
    control = ControlClient(server.path, timeout=5)
    replies, errors = {}, []

    def ask(n):
        try:
            for i in range(50):
                reply = control.call("echo", n=n, i=i)
                assert reply == {"echo": {"n": n, "i": i}}, reply
            replies[n] = True
        except Exception as exc:   # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    control.close()
    assert not errors and sorted(replies) == [0, 1, 2, 3], errors


# ---------------------------------------------------------------- watch: a stream of events
class Subscriptions:
    """A `Watch.subscribe` for the tests: each subscriber's ``send`` is kept, so a
    test pushes events itself; ``ended`` is set when the last one unsubscribes."""

    def __init__(self):
        self.sends = []
        self.subscribed = threading.Event()
        self.ended = threading.Event()

    def subscribe(self, send):
        self.sends.append(send)
        self.subscribed.set()

        def unsubscribe():
            self.sends.remove(send)
            if not self.sends:
                self.ended.set()
        return unsubscribe


@pytest.fixture
def streaming(tmp_path):
    subscriptions = Subscriptions()

    def handler(request):
        if request["op"] == "watch":
            return Watch(subscriptions.subscribe)
        return echo_handler(request)

    control = ControlServer(str(tmp_path / "run" / "control.sock"), handler)
    control.start()
    yield control, subscriptions
    control.stop()


def open_watch(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    stream = sock.makefile("rwb")
    stream.write(b'{"op": "watch"}\n')
    stream.flush()
    return sock, stream


def test_a_watch_is_answered_then_carries_one_line_per_event(streaming):
    server, subscriptions = streaming
    sock, stream = open_watch(server.path)
    try:
        assert json.loads(stream.readline()) == {"ok": True, "watching": True}
        assert subscriptions.subscribed.wait(5)
        subscriptions.sends[0]({"kind": "link", "up": False})
        subscriptions.sends[0]({"kind": "link", "up": True})
        assert [json.loads(stream.readline()) for _ in range(2)] == \
            [{"kind": "link", "up": False}, {"kind": "link", "up": True}]
        stream.write(b'{"op": "echo"}\n')       # ignored: a watch carries events only
        stream.flush()
        subscriptions.sends[0]({"kind": "preset"})
        assert json.loads(stream.readline()) == {"kind": "preset"}
        other = ControlClient(server.path, timeout=5)
        try:
            assert other.call("echo", n=1) == {"echo": {"n": 1}}, \
                "request and reply go on beside a watch"
        finally:
            other.close()
    finally:
        stream.close()
        sock.close()
    assert subscriptions.ended.wait(5), "closing the connection unsubscribes it"
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600


def test_an_event_sent_while_the_reply_is_written_comes_after_it(tmp_path):
    """The subscription starts before the reply, yet no event overtakes it."""
    def subscribe(send):
        threading.Thread(target=send, args=({"kind": "early"},)).start()
        return lambda: None

    control = ControlServer(str(tmp_path / "c.sock"),
                            lambda request: Watch(subscribe, {"watching": True}))
    control.start()
    sock, stream = open_watch(control.path)
    try:
        assert json.loads(stream.readline()) == {"ok": True, "watching": True}
        assert json.loads(stream.readline()) == {"kind": "early"}
    finally:
        stream.close()
        sock.close()
        control.stop()


def test_a_refused_subscription_is_an_error_reply_and_the_channel_lives(tmp_path):
    def subscribe(send):
        raise RuntimeError("no events here")

    def handler(request):
        return Watch(subscribe) if request["op"] == "watch" else echo_handler(request)

    control = ControlServer(str(tmp_path / "c.sock"), handler)
    control.start()
    client = ControlClient(control.path, timeout=5)
    try:
        with pytest.raises(ControlError, match="RuntimeError: no events here"):
            client.call("watch")
        assert client.call("echo", k=1) == {"echo": {"k": 1}}
    finally:
        client.close()
        control.stop()


def test_stop_ends_every_watch_and_unsubscribes_it(streaming):
    server, subscriptions = streaming
    sock, stream = open_watch(server.path)
    try:
        assert json.loads(stream.readline())["watching"]
        server.stop()
        assert stream.readline() == b"", "the server closed the watch"
        assert subscriptions.ended.wait(5)
    finally:
        stream.close()
        sock.close()


def until_still(grows: list, timeout_s: float = 5.0) -> bool:
    """Whether a list that another thread appends to stopped growing (for 50 ms)."""
    deadline = time.monotonic() + timeout_s
    seen = -1
    while time.monotonic() < deadline:
        if len(grows) == seen and seen > 0:
            return True
        seen = len(grows)
        time.sleep(0.05)
    return False


def test_a_client_that_stops_reading_blocks_only_its_own_sends(streaming):
    """The sends of a watch whose client never reads block once the socket's
    buffers are full; the end of the watch wakes them with an error, even
    while the client holds its end open without reading."""
    server, subscriptions = streaming
    sock, stream = open_watch(server.path)
    failed = threading.Event()
    sent = []

    def flood():
        try:
            send = subscriptions.sends[0]
            while True:
                send({"kind": "bulk", "data": "x" * 65536})
                sent.append(1)
        except Exception:       # noqa: BLE001 - what ending the watch raises
            failed.set()

    try:
        assert json.loads(stream.readline())["watching"]
        threading.Thread(target=flood, daemon=True).start()
        assert until_still(sent), "the flood should have filled the socket's buffers"
        assert not failed.is_set(), f"the send blocked (after {len(sent)}), did not fail"
        other = ControlClient(server.path, timeout=5)
        try:
            assert other.call("echo", k=2) == {"echo": {"k": 2}}, \
                "requests go through while the watch's sends are blocked"
        finally:
            other.close()
        sock.shutdown(socket.SHUT_WR)       # "done watching", yet it never reads
        assert subscriptions.ended.wait(5), "the end of the request side ends the watch"
        assert failed.wait(5), "the blocked send ended with an error"
    finally:
        stream.close()
        sock.close()
