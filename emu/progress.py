"""Progress lines for long runs: a bar on a terminal, sparse lines in logs."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


def progress_printer(label: str, stream: TextIO = sys.stderr) -> Callable[[int, int], None]:
    started = time.monotonic()
    last = {"pct": -1}
    tty = stream.isatty()

    def update(done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        elapsed = time.monotonic() - started
        if tty:
            filled = pct // 5
            stream.write(f"\r  {label}: [{'#' * filled}{'.' * (20 - filled)}] "
                         f"{done}/{total} {elapsed:5.1f} s")
            if done >= total:
                stream.write("\n")
            stream.flush()
        elif pct // 25 > last["pct"] // 25 or done >= total:
            stream.write(f"  {label}: {done}/{total} ({pct}%) after {elapsed:.1f} s\n")
            stream.flush()
        last["pct"] = pct

    return update
