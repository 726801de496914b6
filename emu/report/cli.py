"""The command line: ``python -m emu.report RUN_DIR``.

Writes report.md, report.html and the PNG plots of a results folder and
prints their paths, one per line.  Exit codes: 0 written, 2 the folder holds
no result.json or bad input (the message names the file and the key).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from emu.report.writer import write_report


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Write the report of the folder named in ``argv``; the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m emu.report",
        description="Write report.md, report.html and PNG plots for a "
                    "results folder.")
    parser.add_argument("run_dir", help="folder holding result.json (and flows.csv)")
    arguments = parser.parse_args(argv)
    try:
        written = write_report(arguments.run_dir)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
