"""What only the leader (or one node for itself) runs: threads, the node clock, replication calls.

See docs/design/layout.md. The deterministic apply side is ``broker.core``; nothing there imports
from here.
"""
