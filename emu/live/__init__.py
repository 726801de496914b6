"""Everything that runs on the machine while an emulation is up.

Where code goes: a module that forks a process, waits on a Mininet host,
talks to Open vSwitch or to the controller process, or samples the machine
lives here: the testbed lifecycle (`testbed`, `series`, `state`, `ovs`,
`hostroutes`), traffic on the hosts (`replay`, `rlreplay`, `host_agent`,
`iperf_worker`, `capture`), CPU sampling (`cpu`) and the lab CLI (`cli`).
It imports the pure layers (topologies, controllers' channel, traffic) and
nothing else of `emu`; experiments and the runner build on it.
"""
