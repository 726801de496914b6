"""Ports drawn from the ECMP seed (`traffic.ports`): the same for one seed,
others for another, never one port twice on a host."""

from __future__ import annotations

import threading

import pytest

from traffic.ports import CLIENT_PORTS, SERVER_PORTS, PortBook, draw, multipath_hash_seed


def test_a_draw_depends_on_seed_and_key_only_and_stays_in_its_range():
    assert draw(1, "f1", CLIENT_PORTS) == draw(1, "f1", CLIENT_PORTS)
    drawn = {draw(seed, f"f{i}", CLIENT_PORTS) for seed in (1, 2) for i in range(200)}
    assert drawn <= set(CLIENT_PORTS)
    assert len(drawn) > 350, "400 draws over 12,768 ports should hardly ever meet"
    assert [draw(1, f"f{i}", SERVER_PORTS) for i in range(20)] != \
        [draw(2, f"f{i}", SERVER_PORTS) for i in range(20)]


def test_ranges_keep_clear_of_each_other_and_of_the_kernels_ephemeral_ports():
    assert SERVER_PORTS.stop <= CLIENT_PORTS.start
    assert CLIENT_PORTS.stop <= 32768, "Linux's default ephemeral range starts at 32768"


def test_two_books_of_one_seed_hand_out_the_same_ports_in_the_same_order():
    keys = [("h1", f"f{i}") for i in range(100)] + [("h2", f"f{i}") for i in range(100)]
    first, second = PortBook(5), PortBook(5)
    assert [first.server(*k) for k in keys] == [second.server(*k) for k in keys]
    assert [first.client(*k) for k in keys] == [second.client(*k) for k in keys]


def test_a_port_taken_on_a_host_moves_the_next_taker_up_and_other_hosts_are_free():
    book = PortBook(3)
    port = book.server("h1", "f")
    assert book.server("h1", "f") == port + 1     # same draw, taken: the next one up
    assert book.server("h2", "f") == port         # another host has its own ports


def test_the_top_of_a_range_wraps_and_a_full_host_is_an_error():
    book = PortBook(1)
    ports = range(100, 103)
    taken = [book._take("h", "k", ports) for _ in range(3)]
    assert sorted(taken) == [100, 101, 102]
    with pytest.raises(RuntimeError, match="h: every port of 100..102 is taken"):
        book._take("h", "k", ports)


def test_replayers_side_by_side_never_get_one_port_twice_on_a_host():
    book, got = PortBook(1), []
    lock = threading.Lock()

    def take(thread):
        ports = [book.server("h1", f"t{thread}/f{i}") for i in range(300)]
        with lock:
            got.extend(ports)

    threads = [threading.Thread(target=take, args=(t,)) for t in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(set(got)) == len(got) == 1200


def test_seed_0_leaves_client_ports_and_the_hash_key_to_the_kernel():
    book = PortBook(0)
    assert book.client("h1", "f") == 0
    assert book.server("h1", "f") in SERVER_PORTS
    assert multipath_hash_seed(0) == 0
    keys = {multipath_hash_seed(seed) for seed in range(1, 50)}
    assert 0 not in keys and len(keys) == 49 and max(keys) < 2 ** 32


def test_a_negative_seed_is_refused():
    with pytest.raises(ValueError, match="0 or more"):
        PortBook(-1)
