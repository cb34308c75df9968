"""Tests of the raftbroker command line."""
