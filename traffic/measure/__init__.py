"""Capture analysis, pure: pcap files in, per-flow and per-link figures out.

`pcap` reads packet records, gaps and blackouts; `probes` reads a probe
stream's send times and sequence numbers, and the blackout they show;
`linkload` turns one fabric-wide capture into per-link loads.  They read files that `emu.live`
wrote and need neither root nor Mininet, so a run can be analysed again
offline.
"""
