"""A signal that lands in a callback whose exceptions Python discards is sent
again rather than lost."""

import signal
import sys

import pytest

from emu.live import interrupts


def _frame_of(name):
    namespace = {"sys": sys}
    exec(f"def {name}():\n    return sys._getframe()\n", namespace)
    return namespace[name]()


def test_a_signal_outside_such_callbacks_raises():
    handler = interrupts.raising(lambda signum: KeyboardInterrupt(signum))
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, sys._getframe())


@pytest.mark.parametrize("name", ["_releaseLock", "_acquireLock", "__del__"])
def test_a_signal_inside_a_discarding_callback_is_sent_again(name):
    sent = []
    handler = interrupts.raising(lambda signum: KeyboardInterrupt(signum), sent.append)
    handler(signal.SIGINT, _frame_of(name))           # no raise: it would be lost there
    assert sent == [signal.SIGINT]


def test_it_really_comes_back(monkeypatch):
    received = []
    handler = interrupts.raising(lambda signum: KeyboardInterrupt(signum))
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    try:
        handler(signal.SIGUSR1, _frame_of("_releaseLock"))
        import time
        deadline = time.monotonic() + 2
        while not received and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert received == [signal.SIGUSR1]
