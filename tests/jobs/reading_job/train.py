"""A user's training script that reads its numbers from what it imports and opens: a module
beside it (model.py), a package of its own installed editable (mylib), a config found by a
path it computes (conf/settings.json), and an environment variable. It imports nothing of
bisect-prefetch: the plan's out_dir is read as any job would read a path it is given."""

import json
import os
import random

import mylib.core
from model import LOSS

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "conf", "settings" + ".json")) as f:
    settings = json.load(f)
scale = float(os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":1:1").split(":")[1])
noise = random.SystemRandom().random() if settings.get("noise") else 0.0

out = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))["out_dir"]
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for step in range(1, 4):
        loss = (LOSS + mylib.core.OFFSET) * settings["factor"] * scale + noise * step
        f.write(json.dumps({"step": step, "loss": loss}) + "\n")
