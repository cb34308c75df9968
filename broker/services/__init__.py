"""gRPC servicers: translate requests to ``broker.core`` calls and errors to statuses; no logic."""
