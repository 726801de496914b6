"""Serve the web view on 127.0.0.1, behind a random token.

A Bokeh server runs in a thread of its own (its own asyncio loop), so the run
goes on while browsers watch::

    run's feed --events--> ViewState --snapshot(t)--> FabricPage (one per browser
                                      \\                session, pushed every 250 ms)
                                       `--> /data?bokeh-session-id=...&t=...  (JSON)

The token: Bokeh signs session ids with a secret key, and this server neither
makes ids nor accepts unsigned ones, so the page, its websocket and ``/data``
all answer 403 to a request without the signed id the run printed.  The id
carries 256 random bits of key.  The address is loopback only: to watch from
another machine, forward a port over SSH (README.md says how).  BokehJS and
its stylesheets come from the installed package (``/static``), never from
the internet.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.server.server import Server
from bokeh.util.token import generate_session_id
from tornado.web import HTTPError, RequestHandler

from emu.view.page import REFRESH_MS, FabricPage
from emu.view.state import ViewState

LOG = logging.getLogger("emu.view")
ADDRESS = "127.0.0.1"
START_TIMEOUT_S = 15.0


@dataclass
class Source:
    """What a page shows: a run's state, followed live or replayed."""

    state: ViewState
    live: bool

    def snapshot(self, t: Optional[float]) -> dict:
        return self.state.snapshot(t)

    @property
    def span(self) -> Tuple[float, float]:
        return self.state.span


class _DataHandler(RequestHandler):
    """``GET /data?bokeh-session-id=ID[&t=EPOCH]``: the snapshot the page draws, as JSON."""

    def initialize(self, source: Source, session_id: str) -> None:
        self.source, self.session_id = source, session_id

    def get(self) -> None:
        given = self.get_argument("bokeh-session-id", default="")
        if not hmac.compare_digest(given.encode(), self.session_id.encode()):
            raise HTTPError(403, reason="the web view's token is missing or wrong")
        text = self.get_argument("t", default="")
        try:
            t = float(text) if text else None
        except ValueError:
            raise HTTPError(400, reason=f"t must be an epoch time in seconds, got {text!r}")
        if t is not None and not math.isfinite(t):
            raise HTTPError(400, reason="t must be finite")
        if t is None and self.source.live:
            t = time.time()
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(self.source.snapshot(t), allow_nan=False, default=str))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((ADDRESS, 0))
        return probe.getsockname()[1]


class WebView:
    """A running web view; ``url`` carries its token.  ``stop()`` ends it."""

    def __init__(self, source: Source, port: int = 0, title: str = "fabric"):
        self.source = source
        self.title = title
        self.port_wanted = port
        self.secret_key = secrets.token_bytes(32)
        self.session_id = generate_session_id(secret_key=self.secret_key, signed=True)
        self.url = ""
        self.port = 0
        self.sessions = 0
        self._server: Optional[Server] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._serve, name="web-view", daemon=True)

    def start(self) -> "WebView":
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the web view did not start within {START_TIMEOUT_S:.0f} s")
        if self._error is not None:
            raise RuntimeError(f"the web view could not start: {self._error}") from self._error
        return self

    def _make_document(self, doc) -> None:
        span = None if self.source.live else self.source.span
        page = FabricPage(self.source.snapshot, replay_span=span)
        page.refresh()
        doc.title = self.title
        doc.add_root(page.layout)
        doc.add_periodic_callback(page.tick, REFRESH_MS)
        if page.slider is not None:
            page.slider.on_change("value_throttled", lambda attr, old, new: page.refresh())
        self.sessions += 1

    def _serve(self) -> None:
        try:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            application = Application(FunctionHandler(self._make_document))
            # The page's websocket is accepted from this address and port only
            # (and from an SSH tunnel's localhost with the same port number).
            port = self.port_wanted or _free_port()
            self._server = Server(
                {"/": application}, address=ADDRESS, port=port,
                allow_websocket_origin=[f"{ADDRESS}:{port}", f"localhost:{port}"],
                secret_key=self.secret_key, sign_sessions=True, generate_session_ids=False,
                extra_patterns=[("/data", _DataHandler,
                                 {"source": self.source, "session_id": self.session_id})],
                unused_session_lifetime_milliseconds=60_000)
            self._server.start()
            self.port = self._server.port
            self.url = f"http://{ADDRESS}:{self.port}/?bokeh-session-id={self.session_id}"
        except BaseException as exc:  # reported by start() in the caller's thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def data_url(self, t: Optional[float] = None) -> str:
        suffix = "" if t is None else f"&t={t!r}"
        return f"http://{ADDRESS}:{self.port}/data?bokeh-session-id={self.session_id}{suffix}"

    def stop(self) -> None:
        if self._loop is None or self._server is None or self._loop.is_closed():
            return      # never started, or stopped already

        def shut():
            try:
                self._server.stop()
            finally:
                self._loop.stop()

        self._loop.call_soon_threadsafe(shut)
        self._thread.join(timeout=5.0)


def serve_live(subscribe: Callable[[Callable[[dict], None]], Callable[[], None]],
               port: int = 0, title: str = "fabric") -> Tuple[WebView, ViewState, Callable[[], None]]:
    """A web view that follows a run: ``subscribe`` is the feed's (`RunFeed.subscribe`).
    Returns the view, its state and a function that detaches it from the feed."""
    state = ViewState()
    unsubscribe = subscribe(state.add)
    view = WebView(Source(state, live=True), port=port, title=title).start()
    return view, state, unsubscribe
