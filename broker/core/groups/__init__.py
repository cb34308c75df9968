"""Consumer groups (SPEC §3.2): replicated cursors, retries and dead letters; leases in leader memory.

- ``config``: group configuration defaults, validation and the retry backoff.
- ``cursor``: pure cursor math (committed low-watermark plus acked ranges above it).
- ``layout``: the key layout of ``Column.GROUPS`` and the typed reads of it.
- ``apply``: the state-machine handlers of the group commands (the only writer of group state).
- ``leases``: the leader-memory lease table of one group (queue and stream delivery).
- ``membership``: stream-mode members, sessions and the incremental partition assignment.
- ``runtime``: one group's leader-side delivery state (what to hand out next).
- ``delivery``: the subscription stream of a group member.
- ``service``: leader-side group operations (validate, build commands, settle, admin).
"""
