"""Tests of experiment/: the experiment file read, checked and overridden."""
