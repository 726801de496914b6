"""The ordered OCS reconfiguration, as a pure sequence over injected callables.

Steps, each confirmed by an OpenFlow barrier before the next begins:

1. move EPS routes off the circuits that are about to go (reroute over the
   logical graph with only the kept circuits);
2. tear those circuits down;
3. keep the affected ports dark for the injected delay, counted from the
   moment the data plane is confirmed dark when a confirmer is given (a
   barrier reply does not prove the userspace datapath stopped forwarding);
4. light the new circuits;
5. (the barriers of every step);
6. recompute EPS routes over the new logical graph.

``apply`` takes ``{switch: [messages]}``, sends them and returns once every
touched switch answered a barrier.  Timestamps are epoch seconds so that
they can be laid over packet captures.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

from controllers.eps_core import EpsCore
from controllers.ocs_core import OcsCore, ReconfigPlan

Apply = Callable[[Dict[str, List]], None]


def reconfigure(eps: EpsCore, ocs: OcsCore, plan: ReconfigPlan, apply: Apply,
                clock: Callable[[], float] = time.time,
                wait_until: Optional[Callable[[float], None]] = None,
                confirm_dark: Optional[Callable[[List[int]], float]] = None) -> dict:
    wait_until = wait_until or _wait_until
    stamps = {"start": clock()}

    interim = dict(eps.fabric.circuits)
    interim[ocs.name] = set(plan.keep)
    apply(eps.reroute(interim))
    stamps["routes_moved"] = clock()

    if plan.tear:
        apply({ocs.name: ocs.tear_msgs(plan)})
    stamps["torn"] = clock()
    dark_from = stamps["torn"]
    if confirm_dark is not None and plan.tear:
        dark_from = confirm_dark(sorted({p for c in plan.tear for p in c}))
    stamps["dark_confirmed"] = dark_from

    wait_until(dark_from + plan.delay_emulated_s)
    stamps["dark_end"] = clock()

    if plan.light:
        apply({ocs.name: ocs.light_msgs(plan)})
    stamps["lit"] = clock()
    ocs.commit(plan)

    apply(eps.reroute())
    stamps["routes_restored"] = clock()
    return {"plan": plan.to_dict(), "timestamps": stamps,
            "dark_s": stamps["lit"] - stamps["dark_confirmed"]}


def _wait_until(deadline: float) -> None:
    """The injected OCS delay is the thing emulated here, so time is the condition."""
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            return
        # Coarse sleep first, then a short spin for sub-millisecond accuracy.
        time.sleep(remaining - 0.002 if remaining > 0.003 else 0)
