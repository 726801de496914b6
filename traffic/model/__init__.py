"""A flow-level model of the fabrics: flows share links max-min fairly.

Instead of moving packets, the model gives every flow a rate (the max-min fair
share of the links it crosses, `maxmin.py`) and advances from event to event
(`engine.py`: releases, drains, capacity changes), so that DAGs of millions of
flows at full scale finish in seconds.  Pure: no root, no Mininet, only numpy;
SimGrid serves as its oracle in the unit tests, not at run time.
"""
