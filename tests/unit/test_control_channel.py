"""The runner's control channel: JSON lines over a 0600 Unix socket."""

import json
import os
import socket
import stat

import pytest

from controllers.control import ControlClient, ControlError, ControlServer


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
