"""Consumer groups (SPEC §3.2), the apply side: replicated cursors, retries and dead letters.

- ``config``: group configuration defaults, validation and the retry backoff.
- ``cursor``: pure cursor math (committed low-watermark plus acked ranges above it).
- ``layout``: the key layout of ``Column.GROUPS`` and the typed reads of it.
- ``apply``: the state-machine handlers of the group commands (the only writer of group state).
- ``prune_roles``: the mark command and the prune guard it feeds.

Leases, members and delivery live in leader memory: :mod:`broker.leader.groups`.
"""
