"""A finished run's events, read back from its results folder.

The live feed recorded everything but the load samples in ``events.jsonl``
(`emu.live.feed`); each testbed's ``load.csv`` holds those (`emu.live.loadlog`):
in the run folder for a run of one testbed, in ``<run>/<label>/`` for a run
that opened one per fabric.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

from emu.live.feed import EVENTS_FILE, read_events
from emu.view.event_check import EventError, check_event
from emu.view.state import ViewState, load_events

LOAD_FILE = "load.csv"


class ReplayError(ValueError):
    """A results folder the view cannot replay; the message says why."""


def load_run(run_dir: Path) -> ViewState:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReplayError(f"{run_dir}: no such results folder")
    events_path = run_dir / EVENTS_FILE
    if not events_path.is_file():
        raise ReplayError(f"{run_dir}: no {EVENTS_FILE}; only emulated runs record one "
                          "(a run on the flow-level model, or one made before the web "
                          "view existed, cannot be replayed)")
    try:
        events = read_events(events_path)
    except (OSError, ValueError) as exc:
        raise ReplayError(str(exc)) from None
    # Checked now, not when the page asks for the moment an event shows (see
    # `emu.view.event_check`).
    for event in events:
        try:
            check_event(event)
        except EventError as exc:
            raise ReplayError(f"{events_path}: the {event['kind']!r} event at "
                              f"t={event['t']}: {exc}") from None
    try:
        for path in load_files(run_dir):
            events += load_events(path)
    except (OSError, ValueError) as exc:
        raise ReplayError(str(exc)) from None
    if not any(event["kind"] == "testbed" for event in events):
        raise ReplayError(f"{events_path}: no testbed event; the run ended before its "
                          "network was built")
    state = ViewState()
    state.extend(events)
    state.status = "replay"
    return state


def load_files(run_dir: Path) -> List[Path]:
    """The run's load.csv files: its own and its labelled testbeds'."""
    found = [run_dir / LOAD_FILE] if (run_dir / LOAD_FILE).is_file() else []
    found += sorted(path for path in run_dir.glob(f"*/{LOAD_FILE}"))
    return found
