"""iperf3 client settings that shape what reaches the links (no root)."""

import ctypes
import shutil

import pytest

from emu.live.iperf_worker import LARGEST_BLOCK, ClientSpec, build_client, exact_blocks


@pytest.mark.parametrize("num_bytes", [1, 1448, 131072, 131073, 312500, 1250000, 10**9 + 7])
def test_whole_blocks_add_up_to_the_byte_count(num_bytes):
    block = exact_blocks(num_bytes)
    blocks = -(-num_bytes // block)
    assert 0 < block <= LARGEST_BLOCK
    # The sender stops after the block that reaches the count: at most a byte
    # per block over it, never a block's worth queued for nobody.
    assert num_bytes <= blocks * block < num_bytes + blocks


def test_iperf3s_default_block_overshoots_a_flow_by_most_of_a_block():
    """Why: 312.5 KB in whole 128 KiB blocks is 384 KiB written."""
    assert -(-312500 // LARGEST_BLOCK) * LARGEST_BLOCK - 312500 == 80716
    assert exact_blocks(312500) == 104167


def test_bad_byte_count_is_refused():
    with pytest.raises(ValueError, match="positive"):
        exact_blocks(0)


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs libiperf")
def test_a_byte_count_client_gets_the_exact_block_unless_one_is_given():
    assert build_client(ClientSpec("127.0.0.1", 5999, bytes=312500, reverse=True)).blksize \
        == 104167
    assert build_client(ClientSpec("127.0.0.1", 5999, bytes=312500, blksize=8192)).blksize \
        == 8192


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs libiperf")
@pytest.mark.parametrize("field, getter, value", [
    ("window_bytes", "iperf_get_test_socket_bufsize", 14480),   # iperf3 -w
    ("cport", "iperf_get_test_bind_port", 21234),               # iperf3 --cport
])
def test_a_setting_reaches_libiperf_and_none_leaves_the_kernels_default(field, getter, value):
    def held(spec):
        client = build_client(spec)
        get = getattr(client.lib, getter)
        get.argtypes = (ctypes.c_void_p,)
        return get(client._test)

    assert held(ClientSpec("127.0.0.1", 5999, bytes=312500, **{field: value})) == value
    assert held(ClientSpec("127.0.0.1", 5999, bytes=312500)) == 0


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs libiperf")
def test_building_a_client_starts_no_process_once_libiperf_is_known(monkeypatch):
    """The wrapper's own library lookup runs ldconfig, gcc and ld for every
    client; a forked client must start sending when told, not after that."""
    import subprocess
    from emu.live import iperf_worker
    iperf_worker.libiperf.cache_clear()
    assert "libiperf" in iperf_worker.libiperf()

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    for _ in range(2):
        assert build_client(ClientSpec("127.0.0.1", 5999, bytes=1000)).lib is not None


class _Run:
    def __init__(self, error):
        self.json = {"error": error} if error else {"end": {}}


class _Client:
    """A libiperf client stand-in: each run ends with the next scripted error."""

    def __init__(self, errors):
        self.errors = errors

    def run(self):
        return _Run(self.errors.pop(0))


@pytest.mark.parametrize("errors, runs, final", [
    # The server was not listening yet: try again until it is.
    (["unable to connect to server: Connection refused", ""], 2, None),
    # Every try failed: the first one's error is the cause, the rest were
    # refused by a one-off server that had taken its test.
    (["unable to connect stream: No route to host"] +
     ["unable to connect to server: Connection refused"] * 3, 3,
     "unable to connect stream: No route to host (then 2 more tries, the last: "
     "unable to connect to server: Connection refused)"),
])
def test_a_test_that_cannot_connect_is_retried_and_says_why_the_first_try_failed(
        monkeypatch, errors, runs, final):
    from emu.live import iperf_worker
    script = list(errors)
    clients = []

    def build(spec):
        clients.append(_Client(script))
        return clients[-1]

    monkeypatch.setattr(iperf_worker, "build_client", build)
    monkeypatch.setattr(iperf_worker, "CONNECT_RETRIES", 3)
    monkeypatch.setattr(iperf_worker, "CONNECT_RETRY_S", 0.0)
    out = iperf_worker.run_client(ClientSpec(dst="10.0.0.1", port=5201, bytes=138))
    assert len(clients) == runs
    assert out["result"].get("error") == final
