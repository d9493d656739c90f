"""Tests of commands/ through the CLI: transcripts, outputs, bad input."""
