"""One module per command: what it runs, what it prints, how it stops and resumes.

cli.py declares the options and calls one function here (aa.aa, bisect.bisect,
matrix.matrix, audit.audit, compare.compare, graph.graph, graph.masks,
simulate.simulate, report.report, init.init). Each takes a rich Console, returns the exit
code (0 success, 1 a finding) and raises BisectPrefetchError for a usage or
input error, which only cli.py turns into one line and exit code 2. Commands
that run jobs open their state dir through runs/state.py; the shared pieces
(writing an output file, the resume hint on Ctrl-C or SIGTERM) are common.py.
"""
