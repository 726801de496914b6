"""The netlink applier: intents to kernel routers and tc patch panels (``linux``).

`applier` translates intents to netlink requests and carries them out in
each switch's namespace (`namespaces`); `events` turns link changes into port
status; `daemon` is the controller process of this data plane.  pyroute2
speaks netlink; nothing here imports os-ken.
"""
