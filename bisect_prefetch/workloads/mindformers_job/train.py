"""The MindFormers reference workload's entry point: train from a MindFormers YAML on CPU.

Runs inside the MindFormers venv (MindFormers 1.9, MindSpore 2.9), started as a
script (``python train.py --config run.yaml``); it imports
nothing from bisect-prefetch. The MindFormers wheel has no run_mindformer.py,
so this does that job on MindFormers' public API: MindFormerConfig,
build_context, Trainer. Launch it directly for one rank or with msrun for
several (each rank then trains its shard of the data, data parallel).

Before training it writes the data set: a MindRecord file of token ids from a
fixed generator (the same data in every run; the YAML's ``seed`` sets the
weights), exactly ``runner_config.stop_step`` steps long for the YAML's batch
size and data parallelism.

MindFormers' own per-step lines (``loss:[step/mean]``, ``global_norm: [x]``)
go to stdout and to ``output/log/rank_N/info.log`` under the working directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

DATA_SEED = 20240601  # the data never changes between runs; only the YAML's seed does
MINDRECORD_NAME = "tokens.mindrecord"


def write_token_data(path: Path, *, rows: int, seq_length: int, vocab_size: int) -> None:
    """A MindRecord file of `rows` sequences of seq_length + 1 token ids (inputs and shifted labels)."""
    from mindspore.mindrecord import FileWriter

    rng = np.random.RandomState(DATA_SEED)
    tokens = rng.randint(0, vocab_size, size=(rows, seq_length + 1)).astype(np.int32)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + ".db")):
        stale.unlink(missing_ok=True)
    writer = FileWriter(str(path), shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "tokens")
    writer.write_raw_data([{"input_ids": row} for row in tokens])
    writer.commit()


def route_cpu_overflow_check_to_isfinite() -> None:
    """REFERENCE WORKLOAD ONLY: let MindSpore's loss-scale cell check overflow on CPU.

    nn.TrainOneStepWithLossScaleCell (the base of MindFormers' MFTrainOneStepCell)
    has no CPU branch for its overflow check: it falls back to the Ascend 910A
    status op (NPUGetFloatStatusV2), which has no CPU kernel. After its
    __init__ we route CPU to the cell's existing IsFinite-based check (the
    "INFNAN_MODE" path, as on 910B). No MindFormers code changes; a user's job
    on Ascend never runs this.
    """
    import mindspore as ms
    from mindspore import nn

    cell_class = nn.TrainOneStepWithLossScaleCell
    original_init = cell_class.__init__

    def init_then_route_cpu(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if ms.get_context("device_target") == "CPU":
            self.ascend_910b_target = True
            self._ascend_check_overflow_mode = "INFNAN_MODE"
            self.enable_allfinite = False  # AllFinite has no CPU kernel either: use IsFinite

    cell_class.__init__ = init_then_route_cpu


def train(config_path: Path, mode: int | None) -> None:
    from mindformers import MindFormerConfig, Trainer, build_context

    config = MindFormerConfig(str(config_path))
    if mode is not None:
        config.context.mode = mode
    steps = config.runner_config.get("stop_step")
    if not isinstance(steps, int) or steps < 1:
        raise SystemExit(f"{config_path}: runner_config.stop_step must be a step count, got {steps!r}")
    model_config = config.model.model_config
    data_parallel = int(config.parallel_config.data_parallel) if config.use_parallel else 1
    # One file per process: msrun's workers and its scheduler (which runs this
    # script too) start together and must not write the same file.
    data = Path("data") / f"pid_{os.getpid()}" / MINDRECORD_NAME
    write_token_data(data, rows=steps * int(config.runner_config.batch_size) * data_parallel,
                     seq_length=int(model_config.seq_length), vocab_size=int(model_config.vocab_size))
    config.train_dataset.data_loader.dataset_dir = str(data.resolve())
    config.train_dataset_task.dataset_config.data_loader.dataset_dir = str(data.resolve())

    build_context(config)  # after the data: build_context starts msrun's communication
    route_cpu_overflow_check_to_isfinite()
    Trainer(args=config, task="text_generation").train()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, type=Path, help="the run's MindFormers YAML")
    parser.add_argument("--mode", type=int, default=None,
                        help="MindSpore mode: 0 graph, 1 PyNative (default: the YAML's context.mode)")
    args = parser.parse_args(argv)
    train(args.config, args.mode)


if __name__ == "__main__":
    sys.exit(main())
