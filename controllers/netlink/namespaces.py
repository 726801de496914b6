"""Reaching a switch's network namespace from the controller process.

Mininet creates one unnamed network namespace per node, held by the node's
shell; the runner tells the controller each switch's shell pid.  A route
socket is pyroute2's ``IPRoute`` opened in ``/proc/<pid>/ns/net`` (pyroute2
creates it there and hands it back), used from one thread only (see
`ThreadBoundSocket`).  An event socket is a plain netlink
socket subscribed to link changes, created by a thread that entered the
namespace with setns(2) first: a socket belongs to the namespace it was
created in, whichever thread reads it later.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, TypeVar

CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0
RTMGRP_LINK = 0x1

_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


class NamespaceError(RuntimeError):
    """A namespace could not be entered (the node is gone, or not a namespace)."""


def netns_path(pid: int) -> str:
    return f"/proc/{int(pid)}/ns/net"


def route_socket(pid: int) -> "ThreadBoundSocket":
    """A pyroute2 IPRoute bound to the network namespace of process ``pid``,
    used through the netlink thread (`ThreadBoundSocket`)."""
    from pyroute2 import IPRoute

    path = netns_path(pid)
    if not os.path.exists(path):
        raise NamespaceError(f"no network namespace at {path}: is the node running?")
    return ThreadBoundSocket(lambda: IPRoute(netns=path))


class ThreadBoundSocket:
    """A pyroute2 socket that is created, used and closed on one thread.

    pyroute2 (0.9) keeps a netlink socket, an event loop and a message
    queue per calling thread: the first call from another thread opens
    another socket in the namespace (forking ``ldconfig -p`` on the way to
    find libc), 6-9 ms a namespace here, and that socket is never closed.
    The controller calls from several threads: the control connection
    attaches and reconfigures, the link-event watcher reroutes.  So the
    first failure of a run was rerouted 30-40 ms later than any later one
    (a ROFT leaf: 52-77 ms against 19-36 ms), and each thread left a socket
    per namespace behind.  Every call goes to the one netlink thread instead.
    """

    _worker: Optional[ThreadPoolExecutor] = None
    _worker_lock = threading.Lock()
    _on_worker = threading.local()

    def __init__(self, make):
        self._sock = self._run(make)

    @classmethod
    def _executor(cls) -> ThreadPoolExecutor:
        with cls._worker_lock:
            if cls._worker is None:
                cls._worker = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="netlink",
                    initializer=lambda: setattr(cls._on_worker, "flag", True))
            return cls._worker

    @classmethod
    def _run(cls, function, *args, **kwargs):
        if getattr(cls._on_worker, "flag", False):
            return function(*args, **kwargs)      # already on it: waiting would deadlock
        return cls._executor().submit(function, *args, **kwargs).result()

    def __getattr__(self, name):
        if name == "_sock":             # not made yet (or failed): no recursion
            raise AttributeError(name)
        attribute = getattr(self._sock, name)
        if not callable(attribute):
            return attribute

        def on_netlink_thread(*args, **kwargs):
            return self._run(attribute, *args, **kwargs)
        return on_netlink_thread


def link_event_socket(pid: int) -> socket.socket:
    """A netlink socket in ``pid``'s network namespace that receives link changes."""
    return netlink_socket(pid, RTMGRP_LINK)


def netlink_socket(pid: int, groups: int = 0) -> socket.socket:
    """A plain NETLINK_ROUTE socket in ``pid``'s network namespace, subscribed to
    ``groups`` (0: requests and their answers only)."""
    def open_bound():
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        sock.bind((0, groups))
        return sock

    try:
        return in_namespace(pid, open_bound)
    except NamespaceError:
        raise
    except Exception as exc:   # noqa: BLE001
        raise NamespaceError(f"cannot open a netlink socket in {netns_path(pid)}: {exc}") \
            from None


def in_namespace(pid: int, work: Callable[[], T]) -> T:
    """``work()`` done in ``pid``'s network namespace by a thread that enters
    it with setns(2) and ends there, taking the namespace with it: what it
    made stays where it was made (a socket in that namespace), and what it
    looked up was looked up there (an interface name).  Nothing is forked,
    so a process with threads (the runner's) can do it safely."""
    done: dict = {}

    def enter_and_work():
        try:
            fd = os.open(netns_path(pid), os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    error = ctypes.get_errno()
                    raise NamespaceError(f"setns into {netns_path(pid)}: {os.strerror(error)}")
            finally:
                os.close(fd)
            done["value"] = work()
        except BaseException as exc:     # handed to the caller's thread
            done["error"] = exc

    thread = threading.Thread(target=enter_and_work, name=f"netns-{pid}")
    thread.start()
    thread.join()
    if "error" in done:
        raise done["error"]
    return done["value"]
