"""Signal handlers that turn SIGINT and SIGTERM into exceptions that are not lost.

Python runs a signal's handler in the main thread at the next bytecode.  If
that bytecode belongs to a callback whose exceptions Python discards (an
``os.register_at_fork`` hook such as logging's ``_releaseLock``, run while
``subprocess`` forks; a ``__del__``), the KeyboardInterrupt is printed as
"Exception ignored" and the run goes on as if nobody had pressed Ctrl-C.
A cluster run forks an ssh for each process it starts on another server,
so a Ctrl-C fell into one of those hooks about one time in three.  Here the
handler sees that it was called inside such a callback and delivers the
signal again a moment later instead of raising where it would be lost.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, List

# Functions whose exceptions Python discards, by name: logging's fork hooks
# and destructors.
DISCARDING = frozenset({"_acquireLock", "_releaseLock", "_after_at_fork_child_reinit_locks",
                        "__del__"})
REDELIVER_S = 0.02
FRAMES_CHECKED = 3


def _discarding(frame) -> bool:
    for _ in range(FRAMES_CHECKED):
        if frame is None:
            return False
        if frame.f_code.co_name in DISCARDING:
            return True
        frame = frame.f_back
    return False


def raising(make: Callable[[int], BaseException],
            redeliver: Callable[[int], None] = None) -> Callable:
    """A handler that raises ``make(signum)``, or, inside a callback that
    would discard it, sends the signal to this process again shortly."""
    redeliver = redeliver or (lambda signum: threading.Timer(
        REDELIVER_S, os.kill, (os.getpid(), signum)).start())

    def handler(signum, frame):
        if _discarding(frame):
            redeliver(signum)
            return
        raise make(signum)
    return handler


@contextmanager
def deferred(signals=(signal.SIGINT, signal.SIGTERM)) -> Iterator[List[int]]:
    """Signals that arrive inside the block wait for its end.

    Cleanup and the writing of results must run to their end: a Ctrl-C in
    the middle of a teardown would leave half of it undone, and one in the
    middle of ``result.json`` half a file.  The first signal held is
    delivered again when the block ends, to the handler that was in place,
    so the run still ends as interrupted.  Only the main thread may set
    handlers; elsewhere the block runs unguarded.
    """
    held: List[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {signum: signal.signal(signum, lambda s, _frame: held.append(s))
                for signum in signals}
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            os.kill(os.getpid(), held[0])
