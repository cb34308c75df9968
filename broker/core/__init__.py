"""The apply side: what every node applies deterministically, given the command and the store.

Topics, records, dedup, retention, routes and groups (their command handlers and key layouts), and
the state machine that dispatches to them. Nothing here reads time, starts threads or calls the
replicator, and nothing here imports ``broker.leader``, ``broker.services`` or
``broker.replication`` (tests/unit/test_import_rules.py checks it; docs/design/layout.md).
"""
