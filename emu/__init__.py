"""The testbed a user runs: scenarios, the live emulation, results and reports.

Where code goes: whatever forks, waits on a host or talks to a switch or the
controller lives in `emu.live` (testbed lifecycle, replay, captures, agents,
CPU sampling, the lab CLI), which imports no other part of `emu`.
Experiments (`emu.experiments`) combine the pure models with the live
testbed; `emu.run` runs a scenario; `emu.report` turns a results folder into
report.md, report.html and plots, from the files alone.

Layers: topologies <- controllers <- traffic <- emu (docs/architecture.md).
"""
