"""What a run tells whoever watches it: one time-ordered stream of events.

A run's parts report what happens as it happens: the testbed that opens, the
controller's circuit steps and link changes (`emu.live.watch`), the link load
sampled from the switches' port counters (`emu.live.loadlog`), the RL phase
and the control proxy's template (`emu.live.rlreplay`), the P/D requests and
the decode GPUs' credits (`emu.experiments.pd_serve`), and the warnings.  Each
is one event: a JSON object with its ``kind`` and its epoch time ``t``::

    feed = RunFeed(run_dir / "events.jsonl")
    feed.emit("phase", name="rollout", iteration=1)
    unsubscribe = feed.subscribe(listener)      # the web view, while it runs

Every event is written to ``events.jsonl`` as one line (the replay of a
finished run reads it back, `emu.view`), except the load samples, which
``load.csv`` already holds.  Listeners are called in the emitting thread and
must return at once; one that raises is dropped, never the run.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional

LOG = logging.getLogger("emu.feed")
EVENTS_FILE = "events.jsonl"
# Kinds kept out of events.jsonl because a file of their own holds them.
NOT_RECORDED = frozenset({"load"})

Listener = Callable[[dict], None]


class RunFeed:
    """Events of one run, recorded to a file (or nowhere) and handed to listeners."""

    def __init__(self, path: Optional[Path] = None, clock: Callable[[], float] = time.time):
        self.path = None if path is None else Path(path)
        self.clock = clock
        self._lock = threading.Lock()
        self._listeners: List[Listener] = []
        self._stream = None
        self.label: Optional[str] = None    # the open testbed's label, stamped on events

    def emit(self, kind: str, **fields) -> dict:
        """Record one event and hand it to every listener; returns it."""
        event = {"kind": kind, "t": fields.pop("t", None) or self.clock(), **fields}
        if self.label is not None:
            event.setdefault("label", self.label)
        with self._lock:
            if self.path is not None and kind not in NOT_RECORDED:
                if self._stream is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._stream = open(self.path, "a")
                self._stream.write(json.dumps(event, default=_plain) + "\n")
                self._stream.flush()
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:  # a watcher's bug must not stop the run
                LOG.exception("feed listener failed; dropped")
                self.unsubscribe(listener)
        return event

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)
        return lambda: self.unsubscribe(listener)

    def unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None


def _plain(value):
    """JSON for the odd value an event carries: sets and tuples as lists."""
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"an event field of type {type(value).__name__} is not JSON")


def read_events(path: Path) -> List[dict]:
    """The events a run recorded, oldest first; a torn last line (an interrupted
    run) is skipped."""
    events = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return events
    except UnicodeDecodeError as exc:   # a feed writes ASCII: this is no feed's file
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            if number == len(lines):
                break
            raise ValueError(f"{path}: line {number} is not JSON") from None
        if not isinstance(event, dict) or "kind" not in event or "t" not in event:
            raise ValueError(f"{path}: line {number} is not an event (needs 'kind' and 't')")
        # Events are put in time order: a 't' that is no number failed the sort
        # with a TypeError, and a NaN one left the order undefined.
        t = event["t"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise ValueError(f"{path}: line {number}: 't' must be a finite number of "
                             f"seconds, got {t!r}")
        events.append(event)
    return sorted(events, key=lambda e: e["t"])
