"""What a replayed P/D stream measured: TTFT per request, percentiles, KV streams per D.

From the planned requests (`traffic.pdplan`) and the replayed flows'
measured start and end (epoch seconds; ``t0`` is the replay start), all in
emulated seconds: one row per request (`request_rows`), a fabric's headline
figures and peak KV streams per D (`summarize_fabric`), and KV streams into
each D over time (`ingress_series`).  A request is served when every one of
its flows ended ok; TTFT = its last KV end - its arrival.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy

from traffic.pdplan import Planned, request_of


def percentile(values: Iterable[float], q: float) -> Optional[float]:
    """The q-th percentile (0..100), linear between closest ranks (numpy's
    default); None for no values."""
    data = list(values)
    if not data:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    return float(numpy.percentile(data, q))


def peak_concurrency(intervals: Iterable[Tuple[float, float]]) -> int:
    """Most intervals open at once; one ending when another starts does not overlap."""
    events = []
    for start, end in intervals:
        events += [(start, 1), (end, -1)]
    events.sort(key=lambda e: (e[0], e[1]))      # ends (-1) before starts at a tie
    peak = count = 0
    for _, step in events:
        count += step
        peak = max(peak, count)
    return peak


def request_rows(planned: Sequence[Planned], flows, t0: float) -> List[dict]:
    """One row per request from the flows' measured start/end (epoch s; t0 = replay start)."""
    by_request: Dict[str, list] = defaultdict(list)
    moved: Dict[str, int] = defaultdict(int)
    for flow in flows:
        if flow.status == "moved":      # cancelled and resent: its replacement counts
            moved[request_of(flow.id)] += 1
        else:
            by_request[request_of(flow.id)].append(flow)
    rows = []
    for x in planned:
        mine = by_request.get(x.id, [])
        served = bool(mine) and len(mine) == len(x.flow_ids) and \
            all(f.status == "ok" for f in mine)
        row = {"id": x.id, "p": x.p, "d": x.d, "on_home": x.on_home, "served": served,
               "arrival_s": x.arrival_s, "p_queue_s": x.prefill_start_s - x.arrival_s,
               "prefill_s": x.prefill_end_s - x.prefill_start_s, "kv_bytes": x.kv_bytes,
               "moved_flows_count": moved.get(x.id, 0)}
        if mine:
            start = min(f.start for f in mine) - t0
            end = max(f.end for f in mine) - t0
            row.update(kv_start_s=start, kv_end_s=end,
                       credit_wait_s=max(0.0, start - x.prefill_end_s),
                       kv_s=end - start, ttft_s=end - x.arrival_s)
        rows.append(row)
    return rows


def summarize_fabric(rows: Sequence[dict], scale, limit: Optional[int]) -> Tuple[dict, List[dict]]:
    """The fabric's headline figures and its per-D peak streams (``scale``:
    `traffic.scale.Scale`, for the real-time figures; ``limit``: D credits)."""
    served = [r for r in rows if r["served"]]
    ttft = [r["ttft_s"] for r in served]
    kv = [r["kv_s"] for r in served]
    summary = {"requests_count": len(rows), "served_count": len(served)}
    for q in (50, 95, 99):
        value = percentile(ttft, q)
        if value is not None:
            summary[f"ttft_p{q}_s"] = value
            summary[f"ttft_p{q}_real_ms"] = scale.real_seconds(value) * 1000
    if kv:
        summary["kv_p99_s"] = percentile(kv, 99)
        summary["kv_p99_real_ms"] = scale.real_seconds(summary["kv_p99_s"]) * 1000
        summary["credit_wait_mean_s"] = sum(r["credit_wait_s"] for r in served) / len(served)
        span = max(r["kv_end_s"] for r in served) - min(r["arrival_s"] for r in rows)
        if span > 0:
            summary["throughput_emu_rps"] = len(served) / span
            summary["throughput_real_rps"] = len(served) / scale.real_seconds(span)
    streams = []
    for d in sorted({r["d"] for r in rows}):
        spans = [(r["kv_start_s"], r["kv_end_s"]) for r in rows
                 if r["d"] == d and "kv_start_s" in r]
        streams.append({"d": d, "requests_count": len(spans),
                        "peak_streams_count": peak_concurrency(spans),
                        "credit_limit_count": limit})
    summary["peak_streams_per_d_count"] = max((s["peak_streams_count"] for s in streams),
                                              default=0)
    return summary, streams


def ingress_series(rows: Sequence[dict]) -> List[dict]:
    """KV streams into each D over time: one row per change, from the requests'
    measured KV start and end (a request is one stream, as for credits)."""
    series = []
    for d in sorted({r["d"] for r in rows}):
        events = []
        for r in rows:
            if r["d"] == d and "kv_start_s" in r:
                events += [(r["kv_start_s"], 1), (r["kv_end_s"], -1)]
        events.sort(key=lambda e: (e[0], e[1]))
        count = 0
        for t, step in events:
            count += step
            if series and series[-1]["d"] == d and series[-1]["t_s"] == t:
                series[-1]["streams_count"] = count
            else:
                series.append({"d": d, "t_s": t, "streams_count": count})
    return series
