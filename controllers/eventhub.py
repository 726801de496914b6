"""What the controller tells whoever watches it, handed out without ever waiting.

The controller publishes what it does as it does it (a circuit going dark, a
link failing: `controllers.service`) and a watcher on the control channel
(`controllers.control`, the ``watch`` op) writes each event to its socket.
Publishing happens inside a reconfiguration's timed sequence, so it only
appends to each subscriber's own bounded queue; a thread per subscriber
calls its callback.  A subscriber that is slow (a client that stopped
reading) loses its oldest events, never delays the controller; it is told
how many it lost by a ``{"kind": "dropped", "count": n}`` event before the
next one it gets.  A callback that raises is unsubscribed.

    unsubscribe = hub.subscribe(callback)     # callback(event) on its own thread
    hub.publish({"kind": "link", ...})        # returns at once, whoever listens
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, List

LOG = logging.getLogger("fabric.events")
#: Events a subscriber may fall behind by before its oldest are dropped: a
#: reconfiguration publishes four, a failing switch one per link.
QUEUE_SIZE = 1024

Callback = Callable[[dict], None]


class _Subscriber:
    """One callback, its queue and the thread that drains it."""

    def __init__(self, callback: Callback, size: int, on_failure: Callable[["_Subscriber"], None]):
        self.callback = callback
        self.dropped = 0                      # over its whole life
        self._unreported = 0                  # dropped since the last event it got
        self._events: collections.deque = collections.deque(maxlen=size)
        self._ready = threading.Condition()
        self._closed = False
        self._on_failure = on_failure
        self.thread = threading.Thread(target=self._deliver, name="event-subscriber",
                                       daemon=True)

    def offer(self, event: dict) -> None:
        with self._ready:
            if self._closed:
                return
            if len(self._events) == self._events.maxlen:
                self.dropped += 1             # the append below pushes the oldest out
                self._unreported += 1
            self._events.append(event)
            self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._events.clear()
            self._ready.notify()

    def _deliver(self) -> None:
        while True:
            with self._ready:
                while not self._events and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                event = self._events.popleft()
                missed, self._unreported = self._unreported, 0
            try:
                if missed:
                    self.callback({"kind": "dropped", "count": missed, "t": time.time()})
                self.callback(event)
            except OSError as exc:
                # A watcher that went away: an everyday end, not worth a traceback.
                if not self._closed:
                    LOG.info("event subscriber gone (%s); unsubscribed", exc)
                self._on_failure(self)
                return
            except Exception:  # a watcher's failure must not reach the controller
                if not self._closed:          # else it failed because it was closed
                    LOG.exception("event subscriber failed; unsubscribed")
                self._on_failure(self)
                return


class EventHub:
    """Thread-safe fan-out of event dicts to subscribers, each with its own queue."""

    def __init__(self, queue_size: int = QUEUE_SIZE):
        self.queue_size = queue_size
        self._subscribers: List[_Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, callback: Callback) -> Callable[[], None]:
        """Call ``callback(event)`` for every event published from now on, on a
        thread of its own; returns the function that unsubscribes it (which
        does not wait for a callback under way)."""
        subscriber = _Subscriber(callback, self.queue_size, self._remove)
        with self._lock:
            self._subscribers.append(subscriber)
        subscriber.thread.start()
        return lambda: self._remove(subscriber)

    def publish(self, event: dict) -> None:
        """Queue ``event`` for every subscriber; returns at once, never raises."""
        with self._lock:
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            subscriber.offer(event)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    @property
    def dropped(self) -> int:
        """Events the present subscribers lost by falling behind."""
        with self._lock:
            return sum(subscriber.dropped for subscriber in self._subscribers)

    def _remove(self, subscriber: _Subscriber) -> None:
        subscriber.close()
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)
