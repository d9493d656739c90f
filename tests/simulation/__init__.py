"""Tests of simulation/: simulated searches scored, as the simulate command and the benchmarks run them."""
