"""Tests of runs/: state dir, journal, launcher, executors."""
