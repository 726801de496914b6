"""The controller: cores that decide, appliers that carry decisions out.

Where code goes: a *core* (`eps_core`, `ocs_core`, `pins`, `reconfig`,
`proxy_core`, `rfabric_templates`) is pure and returns intents
(`controllers.intents`); it imports only `topologies`.  An *applier* turns
intents into one data plane's messages and confirms them: the OpenFlow one
(`controllers.openflow`, the only package besides `controllers.launcher` that
imports os-ken).  `service` (the controller's state and control operations),
`control` (the 0600 Unix-socket channel) and `launcher` (the process) tie
them together.  `traffic` may import the cores, never the rest.

Layers: topologies <- controllers <- traffic <- emu (docs/architecture.md).
"""
