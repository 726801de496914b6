"""Import shim: the OpenFlow applier runs under os-ken (maintained) or classic Ryu.

os-ken 4.x is the default (Ryu 4.34 does not install on Python 3.11).  Only
the names the testbed uses are re-exported, so a missing one fails at import.
"""

try:
    from os_ken import cfg
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from os_ken.lib import hub
    from os_ken.ofproto import ofproto_v1_3 as ofp
    from os_ken.ofproto import ofproto_v1_3_parser as parser

    FRAMEWORK = "os_ken"
    BaseApp = app_manager.OSKenApp
except ImportError:  # classic Ryu
    from ryu import cfg  # type: ignore[no-redef]
    from ryu.base import app_manager  # type: ignore[no-redef]
    from ryu.controller import ofp_event  # type: ignore[no-redef]
    from ryu.controller.handler import (  # type: ignore[no-redef]
        CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls)
    from ryu.lib import hub  # type: ignore[no-redef]
    from ryu.ofproto import ofproto_v1_3 as ofp  # type: ignore[no-redef]
    from ryu.ofproto import ofproto_v1_3_parser as parser  # type: ignore[no-redef]

    FRAMEWORK = "ryu"
    BaseApp = app_manager.RyuApp

__all__ = ["cfg", "app_manager", "ofp_event", "CONFIG_DISPATCHER", "MAIN_DISPATCHER",
           "set_ev_cls", "hub", "ofp", "parser", "FRAMEWORK", "BaseApp"]
