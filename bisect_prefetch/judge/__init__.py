"""What a finished run's files say: the ranks' files merged, the probe audited, faults, step times.

Readers of a run dir once its job ended; none of them starts, keys or journals a run.
runs/ (the Runner's judge, runs/run_judge.py) imports them; they import nothing of runs/.
"""
