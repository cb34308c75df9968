"""The ``raftbroker`` command line (typer): ``broker.cli.main:app``."""
