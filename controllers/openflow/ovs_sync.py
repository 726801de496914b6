"""Confirm that Open vSwitch's datapath applied an OpenFlow change.

A barrier reply only says ovs-vswitchd's OpenFlow tables changed; its
datapath keeps forwarding with cached megaflows until revalidation (measured
here: an old circuit kept forwarding ~4 ms after its DELETE, a new one took
~2.7 ms to carry its first packet).  Flushing the datapath's flow cache
(``dpctl/del-flows``, what ``ovs-appctl dpctl/del-flows`` sends) makes the
next packet of every flow take the new tables, so the dark window of an OCS
reconfiguration is timed from the data plane.  ``revalidator/wait`` was
tried first: it waits for a full revalidation cycle, up to 500 ms here.

The request goes over ovs-vswitchd's unixctl socket with the `ovs` package's
own client (`ovs.unixctl.client`), the one ovs-appctl's Python twin uses.
The launcher enables it with ``--dataplane-sync`` for the local
ovs-vswitchd, and ``--dataplane-sync-socket PATH`` adds another server's
(a cluster run forwards that server's socket here over ssh).
"""

from __future__ import annotations

import os
import threading
import warnings

with warnings.catch_warnings():
    # ovs.poller warns that eventlet is deprecated when eventlet is installed
    # (os-ken pulls it in); the unixctl client does not use it.
    warnings.simplefilter("ignore", DeprecationWarning)
    import ovs.unixctl.client


class DataplaneSyncError(RuntimeError):
    """ovs-vswitchd could not confirm a datapath change."""


class Unixctl:
    """One unixctl connection to ovs-vswitchd, opened on first use and kept."""

    def __init__(self, path: str):
        self.path = path
        self._client = None
        self._lock = threading.Lock()

    def call(self, command: str, *args: str) -> str:
        with self._lock:
            if self._client is None:
                error, self._client = ovs.unixctl.client.UnixctlClient.create(self.path)
                if error:
                    self._client = None
                    raise DataplaneSyncError(f"cannot reach ovs-vswitchd at {self.path}: "
                                             f"{os.strerror(error)}")
            error, failure, result = self._client.transact(command, list(args))
            if error:
                self._client.close()
                self._client = None
                raise DataplaneSyncError(f"{command}: ovs-vswitchd channel failed: "
                                         f"{os.strerror(error)}")
        if failure is not None:
            raise DataplaneSyncError(f"{command}: {str(failure).strip()}")
        return result or ""

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def flush_datapath(unixctl: Unixctl) -> None:
    unixctl.call("dpctl/del-flows")


def flush_datapaths(unixctls) -> None:
    """Flush several ovs-vswitchd's datapaths (a cluster run's servers)."""
    for unixctl in unixctls:
        flush_datapath(unixctl)
