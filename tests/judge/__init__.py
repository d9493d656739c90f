"""Tests of judge/: a finished run's files read back (signals, the audit of probe and order records)."""
