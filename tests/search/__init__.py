"""Tests of search/: the pure decisions, against the simulated oracle."""
