"""A stand-in hyper-parallel build for tests (see core/fully_shard/hsdp_scheduler.py)."""

__version__ = "0.0.0+standin"
