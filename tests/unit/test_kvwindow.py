"""The bounded KV window: every flow a D admits fits in one egress queue."""

import pytest

from traffic import kvwindow


def test_the_admitted_flows_fit_in_one_queue_together():
    # 41 packets (50 ms at 10 Mbit/s), 2 credits, 2 flows per request: 4 flows of 10.
    assert kvwindow.window_segments(41, 2, 2) == 10
    for queue, credits, flows in [(41, 2, 2), (41, 2, 4), (83, 3, 2), (200, 8, 2)]:
        segments = kvwindow.window_segments(queue, credits, flows)
        assert segments * credits * flows <= queue
        # ... and no larger window would still fit.
        assert (segments + 1) * credits * flows > queue


def test_many_flows_per_d_get_the_smallest_window_not_less():
    assert kvwindow.window_segments(41, 8, 4) == kvwindow.MIN_SEGMENTS
    assert kvwindow.window_segments(10, 2, 2) == kvwindow.MIN_SEGMENTS


def test_the_window_counts_payload_bytes_of_full_segments():
    assert kvwindow.mss(1500) == 1448
    assert kvwindow.window_bytes(kvwindow.BOUNDED, 41, 1500, 2, 2) == 10 * 1448
    assert kvwindow.window_bytes(kvwindow.BOUNDED, 41, 9000, 2, 2) == 10 * 8948


def test_tcp_leaves_the_window_to_autotuning():
    assert kvwindow.window_bytes(kvwindow.TCP, 41, 1500, 2, 2) == 0


def test_bad_rule_and_counts_are_refused_by_name():
    with pytest.raises(ValueError, match="kv_window='rdma'; allowed: bounded, tcp"):
        kvwindow.window_bytes("rdma", 41, 1500, 2, 2)
    with pytest.raises(ValueError, match="d_credits=0"):
        kvwindow.window_segments(41, 0, 2)
