"""Tests of the Python SDK (broker.client)."""
