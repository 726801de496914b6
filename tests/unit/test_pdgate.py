"""KV credits as the replayer's gate: whole requests within the D and path limits."""

from __future__ import annotations

from tests.unit.test_pdplan import _plan, _result
from traffic.pdgate import CreditGate, fabric_links


class _Flow:
    def __init__(self, fid):
        self.id = fid


def test_credit_gate_admits_whole_requests_within_the_limit():
    _, _, planned = _plan()
    same_d = [x for x in planned if x.d == planned[0].d][:4]
    clock = iter(range(1000)).__next__
    gate = CreditGate(same_d, 2, clock=lambda: float(clock()))
    a, b, c, d = same_d
    assert gate.gate(_Flow(f"{a.id}-r0")) and gate.gate(_Flow(f"{a.id}-r1"))
    assert gate.gate(_Flow(f"{b.id}-r1"))
    assert not gate.gate(_Flow(f"{c.id}-r0"))                  # D full: 2 streams
    assert not gate.gate(_Flow(f"{c.id}-r1"))
    gate.done(_result(f"{a.id}-r0", 0, 1))
    assert not gate.gate(_Flow(f"{c.id}-r0"))                  # a still holds its credit
    gate.done(_result(f"{a.id}-r1", 0, 1))
    assert gate.gate(_Flow(f"{c.id}-r0")) and gate.gate(_Flow(f"{c.id}-r1"))
    assert not gate.gate(_Flow(f"{d.id}-r0"))
    assert gate.credits.peak_d[a.d] == 2


def test_path_credits_hold_a_request_whose_fabric_link_is_full():
    _, _, planned = _plan()
    links = {x.id: fabric_links(x.transfer) for x in planned}
    for x in planned:
        for path in x.transfer.paths:
            assert all(not link.startswith("h") for link in links[x.id])
            assert len(path) >= 3
    # Two requests sharing a switch-to-switch link; D credits (4) never bind here.
    pair = next(((a, b) for a in planned for b in planned
                 if a is not b and set(links[a.id]) & set(links[b.id])), None)
    assert pair is not None, "the stream must have two requests sharing a fabric link"
    a, b = pair
    clock = iter(range(1000)).__next__
    unlimited = CreditGate([a, b], 4, clock=lambda: float(clock()))
    assert unlimited.gate(_Flow(f"{a.id}-r0")) and unlimited.gate(_Flow(f"{b.id}-r0"))
    gate = CreditGate([a, b], 4, clock=lambda: float(clock()), path_limit=1)
    assert gate.gate(_Flow(f"{a.id}-r0"))
    assert not gate.gate(_Flow(f"{b.id}-r0")), "b's D has credit but a shared link has not"
    for rank in range(len(a.flow_ids)):
        gate.done(_result(f"{a.id}-r{rank}", 0, 1))
    assert gate.gate(_Flow(f"{b.id}-r0"))
    assert max(gate.credits.peak_link.values()) == 1
