"""End to end on real engines: FSDP2, MindSpore, MindFormers, torchtitan, Slurm."""
