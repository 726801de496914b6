"""The OpenFlow 1.3 applier: intents to Open vSwitch, through os-ken.

`messages` translates intents to OpenFlow messages, `applier` sends them and
waits for barriers, `ovs_sync` flushes Open vSwitch's datapath cache, and
`app` is the os-ken application whose handlers are thin shims over the
applier and the service.  Only this package and `controllers.launcher`
import os-ken (`compat` picks os-ken or classic Ryu).
"""
