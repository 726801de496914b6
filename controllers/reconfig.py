"""The ordered OCS reconfiguration, as a pure sequence over injected callables.

Steps, each confirmed by the applier (OpenFlow: barriers) before the next begins:

1. move EPS routes off the circuits that are about to go, onto the kept
   circuits (every route change of the sequence in `EpsCore.reroute_rounds`'
   loop-free order, a round confirmed before the next); a destination that only the torn circuits reach keeps its
   route (there is nowhere to move it, and dropping it at the EPS would
   start its outage before the OCS goes dark);
2. tear those circuits down, alone in their round, and confirm the data
   plane applied it (``sync``: a barrier reply does not prove that Open
   vSwitch's userspace datapath stopped forwarding); then point the
   stranded destinations at the circuits about to light (they are dark, so
   nothing flows early, and traffic resumes the moment they light).  The
   tear goes first, so that a repointed route meets a dark port, never an
   old circuit that still leads to another ToR;
3. keep the affected ports dark for the injected delay.  The data plane
   applies a change somewhere between sending it and its confirmation, so
   the dark time is counted from the middle of the tear round, which holds
   the tear alone to keep that window short.  An applier that knows more
   tightly when the data plane took a batch says so (``apply`` returns that
   window: the kernel takes a netlink request inside the write that sends
   it) and the middle of that window is used instead: a thread preempted
   for milliseconds before its write would otherwise start the count before
   the circuit went dark, and cut the darkness short by half the stall;
4. light the new circuits, and confirm the datapath applied it.  Lighting
   takes time (flow-mods, barrier, datapath flush), so it is started
   ``light_lead_s`` early: half the lighting round the caller measured
   before, never more than the delay itself;
5. (the barriers of every step);
6. recompute EPS routes over the new logical graph.

``apply`` takes a batch of intents ``{switch: [intents]}``
(`controllers.intents`), has an applier carry them out and returns once every
touched switch confirmed.  Timestamps are epoch seconds so that they can be
laid over packet captures.

``on_step(step, fields)`` hears the sequence as it runs, for whoever shows
circuits going dark and lighting live (`controllers.service` publishes it)::

    "start"  t, tear, light, keep, delay_ms      before any route moves
    "dark"   t, dark_until, tear, light          the ports went dark at t
    "lit"    t, light                            the new circuits carry traffic
    "done"   t, dark_s, tear, light              routes restored over them

Circuits are sorted ``[port, port]`` lists; ``delay_ms`` is the emulated
(dilated) delay.  It is called on the reconfiguring thread, inside the timed
sequence, so it must return at once and never raise.

A data plane that times circuits itself (``timed``: the BPF patch panel,
`controllers.netlink.bpfpanel`) takes steps 2-4 in one write: the tear just
after a moment the kernel fixes and the light ``delay`` after it, which the
kernel enforces per packet.  The controller then only waits for those two
times to pass to repoint (after the tear) and restore routes (after the
light); how late it wakes up no longer stretches the dark window, and each
step's timestamp is the kernel's time for it.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, List, Optional, Tuple

from controllers.eps_core import EpsCore
from controllers.intents import Batch
from controllers.ocs_core import OcsCore, ReconfigPlan

Window = Tuple[float, float]
# Carries a batch out; returns when the data plane took it, if it knows that
# more tightly than the call's own span (else None).
Apply = Callable[[Batch], Optional[Window]]
# Hears each step of the sequence: (step name, its fields).
OnStep = Callable[[str, dict], None]
# Writes a reconfiguration's tear and light intents with the delay between them
# into a data plane that keeps time itself; returns the epoch times it wrote
# (dark from, lit at) and when the write happened (before, after).
Timed = Callable[[list, list, float], Tuple[float, float, Window]]


def reconfigure(eps: EpsCore, ocs: OcsCore, plan: ReconfigPlan, apply: Apply,
                clock: Callable[[], float] = time.time,
                wait_until: Optional[Callable[[float], None]] = None,
                sync: Optional[Callable[[], None]] = None, light_lead_s: float = 0.0,
                on_step: Optional[OnStep] = None, timed: Optional[Timed] = None) -> dict:
    wait_until = wait_until or _wait_until
    sync = sync or (lambda: None)
    on_step = on_step or (lambda step, fields: None)
    stamps = {"start": clock()}
    # Listed once, off the timed part of the sequence.
    tear, light = _pairs(plan.tear), _pairs(plan.light)
    on_step("start", {"t": stamps["start"], "tear": tear, "light": light,
                      "keep": _pairs(plan.keep), "delay_ms": plan.delay_emulated_s * 1000.0})

    interim = dict(eps.fabric.circuits)
    interim[ocs.name] = set(plan.keep)
    target = dict(eps.fabric.circuits)
    target[ocs.name] = plan.keep | plan.light

    _apply_rounds(apply, eps.reroute_rounds(interim, fill_missing_from=eps.table))
    stamps["routes_moved"] = clock()

    repoint = eps.reroute_rounds(interim, fill_missing_from=eps.routes_for(target))
    if timed is not None and (plan.tear or plan.light):
        return _kernel_timed(eps, ocs, plan, apply, clock, wait_until, on_step, timed, stamps,
                             repoint, tear, light)
    stamps["tear_sent"] = clock()
    tear_taken = None
    if plan.tear:
        tear_taken = apply({ocs.name: ocs.tear(plan)})
        sync()
    stamps["torn"] = clock()
    # Only now: a repointed route must meet a dark port, not an old circuit that
    # still leads to another ToR (which would send it back: an outage before the dark).
    _apply_rounds(apply, repoint)
    stamps["repointed"] = clock()

    lead = min(max(light_lead_s, 0.0), plan.delay_emulated_s)
    dark_from = _middle(tear_taken or (stamps["tear_sent"], stamps["torn"]))
    on_step("dark", {"t": dark_from, "dark_until": dark_from + plan.delay_emulated_s,
                     "tear": tear, "light": light})
    wait_until(dark_from + plan.delay_emulated_s - lead)
    stamps["dark_end"] = clock()

    light_taken = None
    if plan.light:
        light_taken = apply({ocs.name: ocs.light(plan)})
        sync()
    stamps["lit"] = clock()
    on_step("lit", {"t": stamps["lit"], "light": light})
    ocs.commit(plan)

    _apply_rounds(apply, eps.reroute_rounds())
    stamps["routes_restored"] = clock()
    dark_s = _middle(light_taken or (stamps["dark_end"], stamps["lit"])) - dark_from
    on_step("done", {"t": stamps["routes_restored"], "dark_s": dark_s, "tear": tear,
                     "light": light})
    return {"plan": plan.to_dict(), "timestamps": stamps, "dark_from": dark_from,
            "light_lead_s": lead, "light_latency_s": stamps["lit"] - stamps["dark_end"],
            "dark_s": dark_s}


def _kernel_timed(eps, ocs, plan, apply, clock, wait_until, on_step, timed, stamps, repoint,
                  tear, light) -> dict:
    """Steps 2-6 when the data plane times the circuits: one write, then waits."""
    stamps["tear_sent"] = clock()
    dark_from, lit_at, written = timed(ocs.tear(plan), ocs.light(plan), plan.delay_emulated_s)
    stamps["written"] = written[1]
    # The kernel tears at dark_from: only then may stranded routes point at
    # the circuits about to light (before, they would meet the old circuit).
    wait_until(dark_from)
    stamps["torn"] = dark_from
    _apply_rounds(apply, repoint)
    stamps["repointed"] = clock()
    on_step("dark", {"t": dark_from, "dark_until": lit_at, "tear": tear, "light": light})
    wait_until(lit_at)
    stamps["dark_end"] = stamps["lit"] = lit_at
    on_step("lit", {"t": lit_at, "light": light})
    ocs.commit(plan)
    _apply_rounds(apply, eps.reroute_rounds())
    stamps["routes_restored"] = clock()
    dark_s = lit_at - dark_from
    on_step("done", {"t": stamps["routes_restored"], "dark_s": dark_s, "tear": tear,
                     "light": light})
    return {"plan": plan.to_dict(), "timestamps": stamps, "dark_from": dark_from,
            "light_lead_s": 0.0, "light_latency_s": 0.0, "dark_s": dark_s,
            "kernel_timed": True, "write_window": list(written)}


def _apply_rounds(apply: Apply, rounds: List[Batch]) -> None:
    """Route changes round by round (`EpsCore.reroute_rounds`), each confirmed
    before the next, so that no packet loops while the switches change."""
    for batch in rounds:
        apply(batch)


def _pairs(circuits: Iterable[Tuple[int, int]]) -> List[List[int]]:
    """Circuits as sorted ``[port, port]`` lists: what JSON carries."""
    return [[int(a), int(b)] for a, b in sorted(circuits)]


def _middle(window: Window) -> float:
    return (window[0] + window[1]) / 2


def _wait_until(deadline: float) -> None:
    """The injected OCS delay is the thing emulated here, so time is the condition."""
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            return
        # Coarse sleep first, then a short spin for sub-millisecond accuracy.
        time.sleep(remaining - 0.002 if remaining > 0.003 else 0)
