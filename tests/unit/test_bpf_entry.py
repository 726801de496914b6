"""A circuit's map entry: its bytes, its constructors, and where it leads when.

`controllers.bpf.entry` packs ``struct circuit`` of ``panel.bpf.c`` and
mirrors the program's ``peer_at``; these tests need neither root nor clang
(test_bpf_panel.py runs the C side on the same cases).
"""

import socket
import struct

import pytest

from controllers.bpf import entry
from controllers.bpf.entry import FOREVER, MAX_SLOTS, Circuit, peer_at

S = 10**9          # one second in ns


def test_an_entry_is_the_184_bytes_of_the_c_struct_in_its_field_order():
    assert entry.ENTRY.size == 184
    circuit = entry.timed(peer_now=3, dark_at=100, peer_next=4, lit_at=200)
    data = circuit.pack()
    assert len(data) == 184
    assert struct.unpack_from("=IIII", data) == (entry.TIMED, 0, 3, 4)
    assert struct.unpack_from("=QQ", data, 16) == (100, 200), "dark_at, lit_at after the u32s"
    schedule = entry.cyclic(epoch=7, period=1000, guard=10, peers=[5, 6, 9])
    data = schedule.pack()
    assert struct.unpack_from("=II", data) == (entry.CYCLIC, 3)
    assert struct.unpack_from("=QQQ", data, 32) == (7, 1000, 10), "epoch, period, guard"
    assert struct.unpack_from("=32I", data, 56) == (5, 6, 9) + (0,) * 29, "peers last"


@pytest.mark.parametrize("circuit", [
    entry.lit(12), entry.dark(), entry.timed(1, 5, 2, 9), entry.timed(0, 0, 7, FOREVER),
    entry.cyclic(10 * S, S, S // 10, list(range(1, MAX_SLOTS + 1)), before=entry.lit(4)),
])
def test_an_entry_survives_packing_and_unpacking(circuit):
    assert entry.unpack(circuit.pack()) == circuit
    assert Circuit.unpack(circuit.pack()).pack() == circuit.pack()


def test_peers_are_always_a_full_row_of_slots_so_equal_entries_compare_equal():
    short = entry.cyclic(0, S, 0, [5, 6])
    assert len(short.peers) == MAX_SLOTS and short.peers[:3] == (5, 6, 0)
    assert short == entry.unpack(short.pack())


def test_a_lit_circuit_stays_lit_and_a_dark_one_dark():
    assert entry.lit(12) == Circuit(peer_now=12, dark_at=FOREVER, lit_at=FOREVER)
    assert entry.dark() == Circuit(peer_now=0, dark_at=FOREVER, lit_at=FOREVER)
    for now in (0, S, FOREVER - 1):
        assert peer_at(entry.lit(12), now) == 12
        assert peer_at(entry.dark(), now) == 0


@pytest.mark.parametrize("make, error", [
    (lambda: entry.lit(0), ValueError),                       # lit to nothing: dark()
    (lambda: entry.lit(-1), ValueError),
    (lambda: entry.lit(2**32), ValueError),
    (lambda: entry.lit(True), TypeError),
    (lambda: entry.lit(3.0), TypeError),
    (lambda: entry.timed(1, 10, 2, 9), ValueError),           # lit before the old one is dark
    (lambda: entry.timed(1, -1, 2, 9), ValueError),
    (lambda: entry.timed(1, 0, 2, FOREVER + 1), ValueError),
    (lambda: entry.cyclic(0, S, S, [1]), ValueError),         # a guard as long as the slot
    (lambda: entry.cyclic(0, 0, 0, [1]), ValueError),
    (lambda: entry.cyclic(0, S, -1, [1]), ValueError),
    (lambda: entry.cyclic(0, S, 0, []), ValueError),
    (lambda: entry.cyclic(0, S, 0, [1] * (MAX_SLOTS + 1)), ValueError),
    (lambda: entry.cyclic(0, S, 0, [1], before=entry.cyclic(0, S, 0, [2])), ValueError),
    (lambda: Circuit(mode=3), ValueError),
    (lambda: Circuit(nslots=MAX_SLOTS + 1), ValueError),
    (lambda: Circuit(peers=(-1,)), ValueError),
])
def test_constructors_refuse_what_the_kernel_would_misread(make, error):
    with pytest.raises(error):
        make()


def test_a_timed_circuit_is_lit_until_dark_at_dark_then_lit_to_the_next_peer_from_lit_at():
    circuit = entry.timed(peer_now=3, dark_at=100, peer_next=4, lit_at=200)
    assert [peer_at(circuit, t) for t in (0, 99, 100, 199, 200, FOREVER)] == \
        [3, 3, 0, 0, 4, 4]


def test_a_torn_circuit_stays_dark_and_a_new_one_is_dark_until_lit_at():
    torn = entry.timed(peer_now=3, dark_at=100, peer_next=0, lit_at=FOREVER)
    assert [peer_at(torn, t) for t in (99, 100, FOREVER - 1)] == [3, 0, 0]
    new = entry.timed(peer_now=0, dark_at=0, peer_next=4, lit_at=200)
    assert [peer_at(new, t) for t in (0, 199, 200)] == [0, 0, 4]


def test_a_cyclic_slot_is_dark_for_its_guard_then_lit_to_its_peer():
    schedule = entry.cyclic(epoch=1000, period=100, guard=10, peers=[5, 6, 7])
    assert peer_at(schedule, 1000) == 0, "slot 0 starts with its guard"
    assert peer_at(schedule, 1009) == 0
    assert peer_at(schedule, 1010) == 5
    assert peer_at(schedule, 1099) == 5
    assert peer_at(schedule, 1100) == 0
    assert peer_at(schedule, 1110) == 6
    assert peer_at(schedule, 1250) == 7


def test_the_slots_wrap_around_after_the_last_peer():
    schedule = entry.cyclic(epoch=0, period=100, guard=10, peers=[5, 6, 7])
    assert [peer_at(schedule, k * 100 + 50) for k in range(7)] == [5, 6, 7, 5, 6, 7, 5]
    far = 10**6 * 300 + 50             # slot 3,000,000: 3,000,000 % 3 == 0
    assert peer_at(schedule, far) == 5


def test_a_slot_without_a_circuit_is_dark():
    schedule = entry.cyclic(epoch=0, period=100, guard=0, peers=[5, 0])
    assert [peer_at(schedule, t) for t in (0, 99, 100, 199, 200)] == [5, 5, 0, 0, 5]


def test_before_its_epoch_a_schedule_keeps_the_present_circuit_lit():
    schedule = entry.cyclic(epoch=1000, period=100, guard=10, peers=[5], before=entry.lit(9))
    assert schedule.dark_at == 1000, "the present circuit goes dark at the epoch at the latest"
    assert [peer_at(schedule, t) for t in (0, 999, 1000, 1010)] == [9, 9, 0, 5]
    assert peer_at(entry.cyclic(1000, 100, 10, [5]), 999) == 0, "dark before by default"


def test_before_its_epoch_a_schedule_keeps_a_pending_reconfiguration():
    pending = entry.timed(peer_now=3, dark_at=100, peer_next=4, lit_at=200)
    schedule = entry.cyclic(epoch=1000, period=100, guard=10, peers=[5], before=pending)
    assert [peer_at(schedule, t) for t in (99, 150, 200, 999, 1005, 1010)] == \
        [3, 0, 4, 4, 0, 5]
    late = entry.timed(peer_now=3, dark_at=5000, peer_next=4, lit_at=6000)
    capped = entry.cyclic(epoch=1000, period=100, guard=10, peers=[5], before=late)
    assert (capped.dark_at, capped.lit_at) == (1000, 6000)
    assert [peer_at(capped, t) for t in (999, 1010, 5550, 6010)] == [3, 5, 5, 5]


def test_an_entry_without_slots_or_period_is_dark_as_in_the_c_program():
    assert peer_at(Circuit(mode=entry.CYCLIC, nslots=0, period=100, epoch=0), 50) == 0
    assert peer_at(Circuit(mode=entry.CYCLIC, nslots=1, period=0, peers=(5,)), 50) == 0


def test_a_dests_key_is_the_address_bytes_as_in_the_packet():
    key = entry.ipv4_key("10.1.2.3")
    assert struct.pack("=I", key) == socket.inet_aton("10.1.2.3")
    with pytest.raises(OSError):
        entry.ipv4_key("10.1")
