"""P/D statistics: percentiles, peak concurrency, TTFT rows, summary and D ingress."""

from __future__ import annotations

import math
import random

import pytest

from tests.unit.test_pdplan import SCALE, _plan, _result
from traffic.pdplan import plan
from traffic.pdstats import (ingress_series, peak_concurrency, percentile, request_rows,
                             summarize_fabric)
from traffic.requests import Request


def test_percentile_linear_and_ordered():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile(range(101), 95) == pytest.approx(95)
    values = [0.3, 5.0, 1.2, 0.9, 2.2, 7.5, 0.1]
    p50, p95, p99 = (percentile(values, q) for q in (50, 95, 99))
    assert p50 <= p95 <= p99 <= max(values)
    with pytest.raises(ValueError):
        percentile(values, 101)


def _closest_ranks(values, q):
    """Linear interpolation between closest ranks, written out."""
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def test_percentile_is_linear_between_closest_ranks_on_any_input():
    rng = random.Random(7)
    for _ in range(200):
        values = [rng.uniform(0, 10) for _ in range(rng.randint(1, 40))]
        q = rng.choice([0, 50, 95, 99, 100, rng.uniform(0, 100)])
        assert percentile(iter(values), q) == pytest.approx(_closest_ranks(values, q))
    assert isinstance(percentile([1, 2], 50), float)
    assert percentile([], 101) is None, "no values: None before q is looked at"


def test_peak_concurrency_from_intervals():
    assert peak_concurrency([]) == 0
    assert peak_concurrency([(0, 1), (1, 2), (2, 3)]) == 1      # touching: no overlap
    assert peak_concurrency([(0, 3), (1, 2), (1.5, 4), (3.5, 5)]) == 3
    assert peak_concurrency([(0, 1), (0, 1)]) == 2


def test_ttft_rows_and_summary():
    _, _, planned = _plan()
    planned = planned[:3]
    t0 = 1000.0
    flows = []
    for i, x in enumerate(planned):
        begin = x.prefill_end_s + 0.5 * i           # credit wait grows
        flows += [_result(f"{x.id}-r0", t0 + begin, t0 + begin + 1.0),
                  _result(f"{x.id}-r1", t0 + begin + 0.1, t0 + begin + 1.5)]
    rows = request_rows(planned, flows, t0)
    for i, (x, row) in enumerate(zip(planned, rows)):
        assert row["served"]
        assert row["kv_s"] == pytest.approx(1.5)
        assert row["credit_wait_s"] == pytest.approx(0.5 * i)
        assert row["ttft_s"] == pytest.approx(x.prefill_end_s + 0.5 * i + 1.5 - x.arrival_s)
        assert row["ttft_s"] == pytest.approx(row["p_queue_s"] + row["prefill_s"]
                                              + row["credit_wait_s"] + row["kv_s"])
    summary, streams = summarize_fabric(rows, SCALE, 2)
    assert summary["served_count"] == 3
    assert summary["ttft_p50_s"] <= summary["ttft_p95_s"] <= summary["ttft_p99_s"]
    assert summary["ttft_p99_real_ms"] == pytest.approx(summary["ttft_p99_s"] / 10 * 1000)
    assert summary["throughput_emu_rps"] > 0
    assert all(s["credit_limit_count"] == 2 for s in streams)


def test_failed_flow_means_not_served():
    _, _, planned = _plan()
    x = planned[0]
    rows = request_rows([x], [_result(f"{x.id}-r0", 1, 2), _result(f"{x.id}-r1", 1, 2,
                                                                      "failed")], 0.0)
    assert not rows[0]["served"]


def test_request_without_flows_is_not_served():
    req = Request("r9", "s9", 0, 0.0, 1000, 0, 10)
    topo, place, _ = _plan()
    x = plan(topo, place, [req], SCALE)[0]
    assert request_rows([x], [], 0.0)[0]["served"] is False


def test_ingress_series_steps_per_d():
    rows = [{"d": 1, "kv_start_s": 0.0, "kv_end_s": 2.0}, {"d": 1, "kv_start_s": 1.0,
                                                             "kv_end_s": 3.0},
            {"d": 2, "kv_start_s": 0.5, "kv_end_s": 1.0}, {"d": 2}]
    series = ingress_series(rows)
    assert [(r["d"], r["t_s"], r["streams_count"]) for r in series] == [
        (1, 0.0, 1), (1, 1.0, 2), (1, 2.0, 1), (1, 3.0, 0), (2, 0.5, 1), (2, 1.0, 0)]


def test_moved_flows_do_not_count_against_serving():
    _, _, planned = _plan()
    x = planned[0]
    flows = [_result(f"{x.id}-r0", 1, 2, "moved"), _result(f"{x.id}-r0~m1", 2, 3),
             _result(f"{x.id}-r1", 1, 2)]
    row = request_rows([x], flows, 0.0)[0]
    assert row["served"] and row["moved_flows_count"] == 1 and row["kv_end_s"] == 3
