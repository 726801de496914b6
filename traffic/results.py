"""What a replayed flow measured: one record per flow, whoever replayed it.

The live replayer (`emu.live.replay`) fills a `FlowResult` from iperf3's
report; the flow-level model (`traffic.model`) fills the same record from its
own times, so the reports, `flows.csv` and the summaries read both alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional


@dataclass
class FlowResult:
    id: str
    src: str
    dst: str
    bytes: int
    step: Optional[int]
    group: str
    start: float = 0.0
    end: float = 0.0
    bytes_received: int = 0
    goodput_mbps: float = 0.0
    retransmits: int = 0
    status: str = "pending"
    error: str = ""
    sport: int = 0            # the data's source port (the sender's), once known
    dport: int = 0            # the data's destination port
    window_bytes: int = 0     # the socket buffers iperf3 set (-w); 0: autotuned

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end - self.start)

    def to_dict(self) -> dict:
        return dict(asdict(self), duration_s=self.duration_s)

    def fill(self, data: dict) -> None:
        """Take a client's output: {"start", "end", "result": iperf3 JSON}."""
        self.start, self.end = data.get("start", 0.0), data.get("end", 0.0)
        iperf = data.get("result", {})
        if "error" in iperf or "error" in data:
            self.status, self.error = "failed", str(iperf.get("error") or data.get("error"))
            return
        end = iperf.get("end", {})
        # TCP reports the receiver's side in sum_received; UDP in sum.
        received = end.get("sum_received") or end.get("sum", {})
        self.bytes_received = int(received.get("bytes", 0))
        self.goodput_mbps = received.get("bits_per_second", 0.0) / 1e6
        self.retransmits = int(end.get("sum_sent", {}).get("retransmits", 0))
        start = iperf.get("start", {})
        connected = (start.get("connected") or [{}])[0]
        local, remote = connected.get("local_port", 0), connected.get("remote_port", 0)
        # In reverse mode the server sends: the data leaves the remote end.
        reverse = (start.get("test_start") or {}).get("reverse")
        self.sport, self.dport = (remote, local) if reverse else (local, remote)
        self.window_bytes = int(start.get("sock_bufsize", 0))
        self.status = "ok"
