"""Tests of metrics/: log parsers, comparison, digests, localization, live following."""
