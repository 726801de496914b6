"""Remove only what this testbed created: ``sudo python -m emu.clean``.

Takes the run lock, so it refuses to pull a running emulation out from under
itself; leftovers of a killed run are removed.
"""

from __future__ import annotations

import sys

from emu.live.state import AlreadyRunning, RunLock, clean


def main(argv=None) -> int:
    try:
        with RunLock().acquire("emu.clean"):
            removed = clean()
    except AlreadyRunning as exc:
        print(f"emu.clean: {exc}", file=sys.stderr)
        return 1
    print(f"emu.clean: removed {len(removed)} item(s)" if removed else "emu.clean: nothing to remove")
    return 0


if __name__ == "__main__":
    sys.exit(main())
