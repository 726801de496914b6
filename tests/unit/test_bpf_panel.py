"""The BPF patch panel's programs, run by the kernel on frames made up here.

BPF_PROG_TEST_RUN runs a loaded tc program once on a frame and returns its
verdict (TC_ACT_OK 0, TC_ACT_SHOT 2, TC_ACT_REDIRECT 7) without sending
anything, so the programs' decisions are checked in the root namespace with
no interface and no emulation.  Entries carry times relative to
``time.monotonic_ns()``: the programs read the same clock
(``bpf_ktime_get_ns`` is CLOCK_MONOTONIC).  A redirect does not say to which
port, so where a test must tell two peers apart, one of them is 0 (dark).

Needs root and clang (the object is compiled into a temporary folder):
skipped, with the reason, without them.
"""

import errno
import json
import shutil
import socket
import struct
import subprocess
import time

import pytest

from controllers.bpf import entry, libbpf
from controllers.bpf.entry import FOREVER, peer_at
from controllers.bpf.libbpf import PanelError, PanelObject, stats

OK, SHOT, REDIRECT = 0, 2, 7
S, MS = 10**9, 10**6


def load(path) -> PanelObject:
    try:
        return PanelObject.load(path)
    except PanelError as exc:
        if exc.errno == errno.EPERM:
            pytest.skip(f"this root may not load BPF programs (a container?): {exc}")
        raise


@pytest.fixture
def panel(object_file):
    """A fresh object per test: fresh maps, so no test sees another's entries."""
    obj = load(object_file)
    yield obj
    obj.close()


def ethernet(ethertype: int, payload: bytes) -> bytes:
    return b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + \
        struct.pack("!H", ethertype) + payload


def ipv4_frame(dst: str, src: str = "10.0.0.1") -> bytes:
    udp = struct.pack("!HHHH", 5000, 5001, 8, 0)
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64,
                         socket.IPPROTO_UDP, 0, socket.inet_aton(src), socket.inet_aton(dst))
    return ethernet(0x0800, header + udp)


ARP_FRAME = ethernet(0x0806, bytes(28))
ANY_FRAME = ipv4_frame("10.0.9.9")


def at_port(panel, port: int, frame: bytes = ANY_FRAME) -> int:
    """ocs_panel's verdict on a frame entering ``port``."""
    return libbpf.test_run(panel.program_fd("ocs_panel"), frame, ifindex=port)


def now() -> int:
    return time.monotonic_ns()


# ------------------------------------------------------------------ ocs_panel
def test_a_port_without_an_entry_drops_every_frame(panel):
    assert at_port(panel, 12) == SHOT
    assert stats(panel.map("stats"))["dropped_no_entry"] == 1


def test_a_lit_circuit_redirects_to_its_peer_and_a_dark_one_drops(panel):
    ports = panel.map("ports")
    ports.update(12, entry.lit(13).pack())
    ports.update(14, entry.dark().pack())
    assert at_port(panel, 12) == REDIRECT
    assert at_port(panel, 14) == SHOT
    assert at_port(panel, 13) == SHOT, "an entry serves its own port only"
    counts = stats(panel.map("stats"))
    assert (counts["redirected"], counts["dropped_dark"], counts["dropped_no_entry"]) == (1, 1, 1)


def test_a_timed_circuit_is_lit_before_dark_at_dark_between_and_lit_after_lit_at(panel):
    t = now()
    ports = panel.map("ports")
    ports.update_many([
        (1, entry.timed(5, t + 10 * S, 6, t + 20 * S).pack()),    # before dark_at
        (2, entry.timed(5, t - 10 * S, 6, t + 10 * S).pack()),    # in the dark window
        (3, entry.timed(5, t - 20 * S, 6, t - 10 * S).pack()),    # after lit_at
        (4, entry.timed(0, t + 10 * S, 6, t + 20 * S).pack()),    # peer_now is what counts
        (5, entry.timed(5, t - 20 * S, 0, t - 10 * S).pack()),    # peer_next is what counts
    ])
    assert [at_port(panel, port) for port in (1, 2, 3, 4, 5)] == \
        [REDIRECT, SHOT, REDIRECT, SHOT, SHOT]


def test_the_kernel_switches_a_timed_circuit_at_its_times_without_another_write(panel):
    window = 150 * MS
    t = now()
    circuit = entry.timed(5, t + window, 6, t + 2 * window)
    panel.map("ports").update(1, circuit.pack())
    checked = []
    for middle in (t + window // 2, t + 3 * window // 2, t + 5 * window // 2):
        time.sleep(max(0, middle - now()) / 1e9)
        before = now()
        verdict = at_port(panel, 1)
        after = now()
        # Asserted only when the run did not straddle a switch time (a stalled machine).
        if bool(peer_at(circuit, before)) == bool(peer_at(circuit, after)):
            assert verdict == (REDIRECT if peer_at(circuit, before) else SHOT)
            checked.append(verdict)
    assert checked == [REDIRECT, SHOT, REDIRECT]


def test_a_cyclic_guard_drops_and_the_current_slot_decides_the_peer(panel):
    t = now()
    ports = panel.map("ports")
    ports.update_many([
        # A guard of a whole second that began 100 ms ago.
        (1, entry.cyclic(t - 100 * MS, 10 * S, S, [5]).pack()),
        # Slot 3 of 1-second slots, half-way through it.
        (2, entry.cyclic(t - 3 * S - S // 2, S, MS, [0, 0, 0, 9]).pack()),
        (3, entry.cyclic(t - 3 * S - S // 2, S, MS, [9, 9, 9, 0]).pack()),
        # Slot 7 of three: slot 1 after the wrap.
        (4, entry.cyclic(t - 7 * S - S // 2, S, MS, [0, 9, 0]).pack()),
        (5, entry.cyclic(t - 7 * S - S // 2, S, MS, [9, 0, 9]).pack()),
        # An epoch long ago: slot ~t/period, here 0 mod 1 slot.
        (6, entry.cyclic(0, S, 0, [9]).pack()),
    ])
    assert [at_port(panel, port) for port in range(1, 7)] == \
        [SHOT, REDIRECT, SHOT, REDIRECT, SHOT, REDIRECT]


def test_a_schedule_starting_later_keeps_the_present_circuit_until_its_epoch(panel):
    t = now()
    later = t + 10 * S
    ports = panel.map("ports")
    ports.update_many([
        (1, entry.cyclic(later, S, MS, [9], before=entry.lit(5)).pack()),
        (2, entry.cyclic(later, S, MS, [9]).pack()),                       # dark before
        (3, entry.cyclic(later, S, MS, [9],
                         before=entry.timed(5, t - S, 0, FOREVER)).pack()),  # torn already
    ])
    assert [at_port(panel, port) for port in (1, 2, 3)] == [REDIRECT, SHOT, SHOT]


def test_the_kernel_and_entry_peer_at_agree(panel):
    t = now()
    cases = [
        entry.lit(3), entry.dark(),
        entry.timed(3, t + S, 4, t + 2 * S), entry.timed(3, t - S, 4, t + S),
        entry.timed(3, t - 2 * S, 4, t - S), entry.timed(0, 0, 4, t + S),
        entry.timed(3, t - S, 0, FOREVER),
        entry.cyclic(t - 250 * MS, 100 * MS, 60 * MS, [3, 4, 0]),     # slot 2: dark
        entry.cyclic(t - 350 * MS, 100 * MS, 30 * MS, [3, 4, 0]),     # slot 3 = slot 0
        entry.cyclic(t - 550 * MS, 100 * MS, 30 * MS, [3, 4, 0, 5]),  # slot 5 = slot 1
        entry.cyclic(t - 510 * MS, 100 * MS, 30 * MS, [3, 4]),        # in a guard
        entry.cyclic(t + S, 100 * MS, 30 * MS, [3], before=entry.lit(7)),
        entry.cyclic(t + S, 100 * MS, 30 * MS, [3]),
    ]
    ports = panel.map("ports")
    ports.update_many([(100 + i, circuit.pack()) for i, circuit in enumerate(cases)])
    for i, circuit in enumerate(cases):
        before = now()
        verdict = at_port(panel, 100 + i)
        after = now()
        expected = {bool(peer_at(circuit, before)), bool(peer_at(circuit, after))}
        assert verdict in {REDIRECT if lit else SHOT for lit in expected}, \
            f"case {i}: {circuit}"


# ------------------------------------------------------------------ the ToR's time-flow table
def test_a_scheduled_destination_follows_its_circuit_and_the_rest_is_routed(panel):
    t = now()
    dests = panel.map("dests")
    dests.update_many([
        (entry.ipv4_key("10.0.2.5"), entry.lit(7).pack()),
        (entry.ipv4_key("10.0.2.6"), entry.cyclic(t - 100 * MS, 10 * S, S, [7]).pack()),
    ])
    timeflow = panel.program_fd("tor_timeflow")
    assert libbpf.test_run(timeflow, ipv4_frame("10.0.2.5"), ifindex=3) == REDIRECT
    assert libbpf.test_run(timeflow, ipv4_frame("10.0.2.6"), ifindex=3) == SHOT, "in its guard"
    assert libbpf.test_run(timeflow, ipv4_frame("10.0.1.5"), ifindex=3) == OK, "not scheduled"
    assert libbpf.test_run(timeflow, ipv4_frame("10.0.9.9", src="10.0.2.5"), ifindex=3) == OK, \
        "the destination is looked up, not the source"
    assert libbpf.test_run(timeflow, ARP_FRAME, ifindex=3) == OK
    # (A truncated IPv4 header cannot be tried: BPF_PROG_TEST_RUN refuses such
    # a frame itself, EINVAL.  The verifier holds the program to its bounds check.)
    counts = stats(panel.map("stats"))
    assert (counts["redirected"], counts["dropped_dark"], counts["passed"]) == (1, 1, 3)


def test_an_uplink_drops_frames_for_another_tors_hosts_and_passes_the_rest(panel):
    panel.map("dests").update(entry.ipv4_key("10.0.2.5"), entry.lit(7).pack())
    uplink = panel.program_fd("tor_uplink")
    assert libbpf.test_run(uplink, ipv4_frame("10.0.2.5"), ifindex=4) == SHOT, "misdelivered"
    assert libbpf.test_run(uplink, ipv4_frame("10.0.1.5"), ifindex=4) == OK, "one of ours"
    assert libbpf.test_run(uplink, ARP_FRAME, ifindex=4) == OK
    counts = stats(panel.map("stats"))
    assert (counts["dropped_no_entry"], counts["passed"]) == (1, 2)


# ------------------------------------------------------------------ maps and the object
def test_each_load_has_its_own_maps(object_file, panel):
    other = load(object_file)
    try:
        panel.map("ports").update(12, entry.lit(13).pack())
        assert other.map("ports").lookup(12) is None
        assert at_port(other, 12) == SHOT and at_port(panel, 12) == REDIRECT
    finally:
        other.close()


def test_a_map_reads_back_what_was_written_and_clears(panel):
    ports = panel.map("ports")
    ports.update_many([(port, entry.lit(port + 1).pack()) for port in range(1, 301)])
    ports.update_many([])
    assert sorted(ports.keys()) == list(range(1, 301))
    assert entry.unpack(ports.lookup(42)) == entry.lit(43)
    assert ports.lookup(999) is None
    ports.delete(42)
    ports.delete(42)                                       # already gone: no error
    assert ports.lookup(42) is None
    with pytest.raises(ValueError):
        ports.update(1, b"short")
    ports.clear()
    assert ports.keys() == []
    at_port(panel, 1)
    panel.map("stats").clear()
    assert set(stats(panel.map("stats")).values()) == {0}


def test_a_closed_object_refuses_its_maps_rather_than_write_to_a_reused_descriptor(object_file):
    obj = load(object_file)
    ports = obj.map("ports")
    obj.close()
    obj.close()
    with pytest.raises(OSError):
        ports.update(1, entry.lit(2).pack())
    with pytest.raises(PanelError):
        obj.program_fd("ocs_panel")


def _bpftool(kind: str) -> list:
    out = subprocess.run(["bpftool", "-j", kind, "show"], capture_output=True, text=True,
                         check=True, timeout=10).stdout
    return json.loads(out or "[]")


@pytest.mark.skipif(shutil.which("bpftool") is None, reason="bpftool is not installed")
def test_closing_the_object_leaves_no_program_or_map_behind(object_file):
    def panels():
        return {p["id"]: p.get("map_ids", []) for p in _bpftool("prog")
                if p.get("name") == "ocs_panel"}

    before = panels()
    obj = load(object_file)
    ours = {prog: maps for prog, maps in panels().items() if prog not in before}
    assert len(ours) == 1, "one ocs_panel per load"
    (map_ids,) = ours.values()
    assert map_ids, "the program uses its maps"
    obj.close()
    # Freed when the last descriptor closes; allow the kernel a moment.
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        left = set(ours) & set(panels())
        maps_left = set(map_ids) & {m["id"] for m in _bpftool("map")}
        if not left and not maps_left:
            break
        time.sleep(0.05)
    assert not left, f"programs {left} outlived their object"
    assert not maps_left, f"maps {maps_left} outlived their object"


def test_a_full_map_refuses_the_rest_of_a_batch_and_says_where(panel):
    ports = panel.map("ports")                              # max_entries 1024
    items = [(port, entry.lit(1).pack()) for port in range(1, ports.max_entries + 2)]
    with pytest.raises(OSError) as failure:
        ports.update_many(items)
    assert failure.value.errno == errno.E2BIG
    assert f"at key {ports.max_entries + 1}" in str(failure.value)
    assert len(ports.keys()) == ports.max_entries


def test_a_map_without_batch_updates_is_written_one_key_at_a_time(panel):
    ports = panel.map("ports")
    ports._batch = False                                    # as where the kernel has none
    ports.update_many([(port, entry.lit(port + 1).pack()) for port in range(1, 11)])
    assert sorted(ports.keys()) == list(range(1, 11))
    with pytest.raises(ValueError):
        ports.update(-1, entry.lit(2).pack())


def test_a_missing_object_says_how_to_build_it(tmp_path):
    with pytest.raises(PanelError, match="controllers.bpf.build"):
        PanelObject.load(tmp_path / "panel.bpf.o")
