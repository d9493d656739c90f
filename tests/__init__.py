"""The tests, laid out like the package: search, adapters, runs, metrics, commands, workloads;
e2e holds the real-engine end-to-end files, jobs the user-style scripts they launch."""
