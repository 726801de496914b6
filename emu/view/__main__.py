"""python -m emu.view RESULTS_DIR: replay a finished run in the browser.

Serves the same page as ``emu.run SCENARIO --web``, from the run's recorded
files, with a time slider; on 127.0.0.1, behind the printed token.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import List, Optional

from emu.view.replay import ReplayError, load_run
from emu.view.server import Source, WebView

EXIT_BAD_INPUT = 2


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emu.view", description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a run's results folder (results/<scenario>-<time>)")
    parser.add_argument("--port", type=int, default=0,
                        help="port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"emu.view: --port {args.port}: must be 0-65535", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        state = load_run(args.results)
    except ReplayError as exc:
        print(f"emu.view: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        view = WebView(Source(state, live=False), port=args.port,
                       title=f"replay of {args.results}").start()
    except RuntimeError as exc:
        print(f"emu.view: {exc}", file=sys.stderr)
        return 1
    start, end = state.span
    print(f"emu.view: replaying {args.results} ({end - start:.1f} s of events)")
    print(f"  open {view.url}")
    print("  (Ctrl-C to stop; from another machine: ssh -L PORT:127.0.0.1:PORT this-host)",
          flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    view.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
