"""Consumer groups (SPEC §3.2), the leader side: leases in leader memory, delivery, operations.

- ``leases``: the leader-memory lease table of one group (queue and stream delivery).
- ``membership``: stream-mode members, sessions and the incremental partition assignment.
- ``runtime``: one group's leader-side delivery state (what to hand out next).
- ``delivery``: the subscription stream of a group member.
- ``service``: leader-side group operations (validate, build commands, settle, admin).
- ``operations``: the admin operations (describe, lag, seek, dead letters) built on the service.

The replicated state they read and the commands they submit are applied by :mod:`broker.core.groups`.
"""
