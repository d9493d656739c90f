"""Tests of adapters/: the code that runs inside the training job."""
