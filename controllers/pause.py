"""Named pause points, for tests that must act at an exact moment of a run.

A test that kills the controller inside an OCS dark window, or interrupts a
run while it builds its network, must not guess that moment with sleeps.
Instead it names the point in the environment of the run::

    FABRIC_EMU_PAUSE_AT=ocs-dark,teardown   the points to pause at
    FABRIC_EMU_PAUSE_DIR=/tmp/pauses        where the markers go

and the process that reaches a named point writes ``<dir>/<point>.reached``
(holding its pid), then waits until ``<dir>/<point>.go`` exists or
``PAUSE_TIMEOUT_S`` passed.  The test waits for the first file, does what it
tests (a signal, a ``kill -9``), then writes the second.  A point pauses once
per directory, whichever process reaches it first: a controller restarted
after the kill does not pause at the same point again.

Without the two variables `pause_at` returns at once and costs one lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_AT = "FABRIC_EMU_PAUSE_AT"
PAUSE_DIR = "FABRIC_EMU_PAUSE_DIR"
PAUSE_TIMEOUT_S = 120.0


def pause_at(point: str) -> None:
    """Pause here if a test named this point (see the module's docstring)."""
    names = os.environ.get(PAUSE_AT)
    directory = os.environ.get(PAUSE_DIR)
    if not names or not directory or point not in names.split(","):
        return
    claim = Path(directory) / f"{point}.claimed"
    try:
        # O_EXCL: of two processes reaching the point, one pauses.
        os.close(os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return
    # Renamed into place whole: a test that sees the file can read the pid.
    reached = Path(directory) / f"{point}.reached"
    partial = Path(directory) / f".{point}.reached.tmp"
    partial.write_text(str(os.getpid()))
    os.replace(partial, reached)
    go = Path(directory) / f"{point}.go"
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
