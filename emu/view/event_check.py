"""What each kind of event must carry for the view to show it.

A replay reads a finished run's ``events.jsonl``, which is only as sound as the
disk it sat on, or whoever edited it.  The view folds events into the picture
of a moment only when the page asks for that moment (`emu.view.state`), so an
event missing a key, or holding a list where a name belongs, used to fail
there: a traceback behind the page, for one moment of the run, long after the
folder was loaded.  `check_event` is run on every recorded event when the run
is loaded (`emu.view.replay.load_run`) and names the key the view cannot use.

Only what the fold reads is checked; anything else an event carries is passed
to the page as it is.  The live feed builds its events in code and is not
checked.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict

from traffic.scale import Scale


class EventError(ValueError):
    """A recorded event the view cannot show; the message names the key."""


def check_event(event: dict) -> None:
    """Raise EventError naming the key of ``event`` that the view cannot show."""
    _text(event, "kind")
    _number(event, "t")
    check = CHECKS.get(event["kind"])
    if check is not None:
        check(event)


# ------------------------------------------------------------ one check per kind
def _testbed(event: dict) -> None:
    fabric = event.get("fabric")
    if not isinstance(fabric, dict):
        raise EventError(f"'fabric' must be an object (the fabric's nodes and links), "
                         f"got {_short(fabric)}")
    _text(fabric, "name", "fabric.name")
    nodes, links = fabric.get("nodes"), fabric.get("links")
    if not isinstance(nodes, list) or not isinstance(links, list):
        raise EventError("'fabric.nodes' and 'fabric.links' must be lists")
    for index, node in enumerate(nodes):
        where = f"fabric.nodes[{index}]"
        _object(node, where)
        _text(node, "name", f"{where}.name")
        _text(node, "kind", f"{where}.kind")
        _text(node, "role", f"{where}.role", optional=True)
        _text(node, "technology", f"{where}.technology", optional=True)
    names = {node["name"] for node in nodes}
    for index, link in enumerate(links):
        where = f"fabric.links[{index}]"
        _object(link, where)
        for end in ("u", "v"):
            _text(link, end, f"{where}.{end}")
            if link[end] not in names:
                raise EventError(f"'{where}.{end}' is {link[end]!r}, not a node of the fabric")
        _integer(link, "port_u", f"{where}.port_u")
        _integer(link, "port_v", f"{where}.port_v")
        _number(link, "gbps", f"{where}.gbps", minimum=0.0)
        _text(link, "medium", f"{where}.medium")
    circuits = fabric.get("circuits", {})
    if not isinstance(circuits, dict):
        raise EventError(f"'fabric.circuits' must be an object, got {_short(circuits)}")
    for ocs, pairs in circuits.items():
        _pairs(pairs, f"fabric.circuits.{ocs}")
    _text(event, "label", optional=True)
    _text(event, "dataplane", optional=True)
    scale = event.get("scale") or {}
    if not isinstance(scale, dict):
        raise EventError(f"'scale' must be an object, got {_short(scale)}")
    try:
        Scale.from_dict(scale)
    except (TypeError, ValueError) as exc:
        raise EventError(f"'scale': {exc}") from None


def _circuit(event: dict) -> None:
    _text(event, "ocs")
    _text(event, "step")
    _text(event, "technology", optional=True)
    for key in ("tear", "light"):
        if event.get(key) is not None:
            _pairs(event[key], key)
    for key in ("delay_ms", "dark_s"):         # durations: shown in real time too
        _number(event, key, optional=True, minimum=0.0)
    _number(event, "dark_until", optional=True)


def _link(event: dict) -> None:
    _text(event, "a")
    _text(event, "b")
    if "up" not in event:
        raise EventError("'up' is missing")


def _schedule(event: dict) -> None:
    if event.get("stopped"):
        return
    for key in ("slot_emulated_s", "guard_emulated_s", "duty_cycle"):
        _number(event, key, optional=True)
    ocs = event.get("ocs")
    if ocs is not None and (not isinstance(ocs, list)
                            or not all(isinstance(name, str) for name in ocs)):
        raise EventError(f"'ocs' must be a list of OCS names, got {_short(ocs)}")


def _preset(event: dict) -> None:
    _text(event, "ocs")
    _text(event, "technology")


def _phase(event: dict) -> None:
    for key in ("iteration", "name"):          # together they name a running phase
        _scalar(event, key)


def _request(event: dict) -> None:
    _scalar(event, "id", optional=False)     # shown as text: any name or number
    _text(event, "state")
    d = event.get("d")
    if d is not None and not isinstance(d, str) and not (
            isinstance(d, list) and all(isinstance(name, str) for name in d)):
        raise EventError(f"'d' must be a host name or a list of them, got {_short(d)}")
    _number(event, "streams", optional=True)


def _credits(event: dict) -> None:
    _text(event, "d")
    if "used" not in event:
        raise EventError("'used' is missing")


def _cpu(event: dict) -> None:
    _number(event, "machine_pct", optional=True)
    _number(event, "softirq_pct", optional=True)


def _warning(event: dict) -> None:
    _text(event, "text")


def _run(event: dict) -> None:
    _text(event, "status", optional=True)


def _load(event: dict) -> None:
    links = event.get("links")
    if not isinstance(links, list):
        raise EventError(f"'links' must be a list, got {_short(links)}")
    for index, sample in enumerate(links):
        if not (isinstance(sample, list) and len(sample) == 5
                and isinstance(sample[0], str) and _is_integer(sample[1])
                and isinstance(sample[2], str) and _is_integer(sample[3])
                and _is_number(sample[4])):
            raise EventError(f"'links[{index}]' must be [node, port, peer, peer_port, Mbit/s], "
                             f"got {_short(sample)}")


CHECKS: Dict[str, Callable[[dict], None]] = {
    "testbed": _testbed, "circuit": _circuit, "link": _link, "schedule": _schedule,
    "preset": _preset, "phase": _phase, "iteration": lambda e: _scalar(e, "iteration"),
    "request": _request, "credits": _credits, "cpu": _cpu, "warning": _warning, "run": _run,
    "load": _load,
}


# ------------------------------------------------------------ the checks' parts
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _object(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise EventError(f"'{where}' must be an object, got {_short(value)}")


def _text(table: dict, key: str, where: str = "", optional: bool = False) -> None:
    value = table.get(key)
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise EventError(f"'{where or key}' must be a string, got {_short(value)}")


def _number(table: dict, key: str, where: str = "", optional: bool = False,
            minimum: float = -math.inf) -> None:
    value = table.get(key)
    if value is None and optional:
        return
    if not _is_number(value) or value < minimum:
        bound = "" if minimum == -math.inf else f" >= {minimum:g}"
        raise EventError(f"'{where or key}' must be a finite number{bound}, got {_short(value)}")


def _integer(table: dict, key: str, where: str) -> None:
    if not _is_integer(table.get(key)):
        raise EventError(f"'{where}' must be an integer, got {_short(table.get(key))}")


def _scalar(table: dict, key: str, optional: bool = True) -> None:
    """A value the view keys a table by (hashable, and sortable among its kind)."""
    value = table.get(key)
    if value is None and optional:
        return
    if value is None or isinstance(value, (list, dict)) \
            or (isinstance(value, float) and not math.isfinite(value)):
        raise EventError(f"'{key}' must be a name or a number, got {_short(value)}")


def _pairs(pairs: Any, where: str) -> None:
    if not isinstance(pairs, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(map(_is_integer, pair))
            for pair in pairs):
        raise EventError(f"'{where}' must be a list of port pairs [a, b], got {_short(pairs)}")
