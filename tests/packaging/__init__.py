"""Tests of the built and installed distribution (wheel, sdist)."""
