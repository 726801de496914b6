"""What a controller must remember to come back after a crash: its state file.

The switches keep forwarding when the controller dies (they are fail-secure),
but what they hold is the controller's last decisions: the circuits of every
OCS, each OCS's technology, the links failed by hand, the pins.  A
controller started again with ``--resume`` reads them from this file instead
of the fabric's starting point, so that it brings every switch back to where
it was (`controllers.service.FabricService.resync`), not to the circuits the
run began with.

It also keeps the replies of the last requests that carried an id: a
request retried after a crash (the runner never got its reply) is answered
from here if it had been carried out, and carried out if not.

The file is JSON, written whole to a temporary name and renamed over the
old one, so a reader never sees half of it, whenever the writer dies::

    {"version": 1,
     "circuits": {"o1": [[1, 4], [2, 3]]},
     "technology": {"o1": {"name": "mems", "delay_ms": null}},
     "manual_down": [["s1", "s5"]],
     "pins": {"kv-3": ["h1", "s1", "s9", "h7"]},
     "requests": [["reconfigure-7", {...reply...}], ...]}
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional

VERSION = 1
# Enough for any retry: a runner retries its one request in flight.
REQUESTS_KEPT = 64


class StateFileError(ValueError):
    """The state file is missing, unreadable or not one this version wrote."""


@dataclass
class ControllerState:
    circuits: Dict[str, List[List[int]]] = field(default_factory=dict)
    technology: Dict[str, dict] = field(default_factory=dict)
    manual_down: List[List[str]] = field(default_factory=list)
    pins: Dict[str, List[str]] = field(default_factory=dict)
    requests: "OrderedDict[str, dict]" = field(default_factory=OrderedDict)

    def remember(self, request_id: str, reply: dict) -> None:
        self.requests[request_id] = reply
        self.requests.move_to_end(request_id)
        while len(self.requests) > REQUESTS_KEPT:
            self.requests.popitem(last=False)

    def to_dict(self) -> dict:
        return {"version": VERSION, "circuits": self.circuits, "technology": self.technology,
                "manual_down": self.manual_down, "pins": self.pins,
                "requests": [[key, reply] for key, reply in self.requests.items()]}

    @classmethod
    def from_dict(cls, data: dict, where: str) -> "ControllerState":
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise StateFileError(f"{where}: not a version-{VERSION} controller state file")
        try:
            return cls(circuits={str(o): [[int(a), int(b)] for a, b in cs]
                                 for o, cs in data["circuits"].items()},
                       technology={str(o): {"name": str(t["name"]),
                                            "delay_ms": t.get("delay_ms")}
                                   for o, t in data["technology"].items()},
                       manual_down=[[str(u), str(v)] for u, v in data["manual_down"]],
                       pins={str(p): [str(n) for n in path]
                             for p, path in data["pins"].items()},
                       requests=OrderedDict((str(k), dict(r)) for k, r in data["requests"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateFileError(f"{where}: malformed ({type(exc).__name__}: {exc})") from None


def save(path: str, state: ControllerState) -> None:
    """Write the state atomically: whole, or not at all."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as stream:
        json.dump(state.to_dict(), stream)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)


def load(path: str) -> Optional[ControllerState]:
    """The state a controller saved at ``path``; None if it never saved one
    (it died before its first change: the fabric's start is its state)."""
    try:
        with open(path) as stream:
            text = stream.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(f"{path}: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateFileError(f"{path}: not JSON ({exc})") from None
    return ControllerState.from_dict(data, path)
