"""Tests of workloads/: the built-in reference jobs and their rank starter."""
