"""Tests of drivers/: the real oracle over slots of an executor."""
