"""The ordered OCS reconfiguration, as a pure sequence over injected callables.

Steps, each confirmed by the applier (OpenFlow: barriers) before the next begins:

1. move EPS routes off the circuits that are about to go, onto the kept
   circuits; a destination that only the torn circuits reach keeps its
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
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Tuple

from controllers.eps_core import EpsCore
from controllers.intents import Batch
from controllers.ocs_core import OcsCore, ReconfigPlan

Window = Tuple[float, float]
# Carries a batch out; returns when the data plane took it, if it knows that
# more tightly than the call's own span (else None).
Apply = Callable[[Batch], Optional[Window]]


def reconfigure(eps: EpsCore, ocs: OcsCore, plan: ReconfigPlan, apply: Apply,
                clock: Callable[[], float] = time.time,
                wait_until: Optional[Callable[[float], None]] = None,
                sync: Optional[Callable[[], None]] = None, light_lead_s: float = 0.0) -> dict:
    wait_until = wait_until or _wait_until
    sync = sync or (lambda: None)
    stamps = {"start": clock()}

    interim = dict(eps.fabric.circuits)
    interim[ocs.name] = set(plan.keep)
    target = dict(eps.fabric.circuits)
    target[ocs.name] = plan.keep | plan.light

    apply(eps.reroute(interim, fill_missing_from=eps.table))
    stamps["routes_moved"] = clock()

    repoint = eps.reroute(interim, fill_missing_from=eps.routes_for(target))
    stamps["tear_sent"] = clock()
    tear_taken = None
    if plan.tear:
        tear_taken = apply({ocs.name: ocs.tear(plan)})
        sync()
    stamps["torn"] = clock()
    # Only now: a repointed route must meet a dark port, not an old circuit that
    # still leads to another ToR (which would send it back: an outage before the dark).
    if repoint:
        apply(repoint)
    stamps["repointed"] = clock()

    lead = min(max(light_lead_s, 0.0), plan.delay_emulated_s)
    dark_from = _middle(tear_taken or (stamps["tear_sent"], stamps["torn"]))
    wait_until(dark_from + plan.delay_emulated_s - lead)
    stamps["dark_end"] = clock()

    light_taken = None
    if plan.light:
        light_taken = apply({ocs.name: ocs.light(plan)})
        sync()
    stamps["lit"] = clock()
    ocs.commit(plan)

    apply(eps.reroute())
    stamps["routes_restored"] = clock()
    return {"plan": plan.to_dict(), "timestamps": stamps, "dark_from": dark_from,
            "light_lead_s": lead, "light_latency_s": stamps["lit"] - stamps["dark_end"],
            "dark_s": _middle(light_taken or (stamps["dark_end"], stamps["lit"])) - dark_from}


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
