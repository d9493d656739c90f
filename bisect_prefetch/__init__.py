"""bisect-prefetch: find the FSDP prefetch edges that make same-seed runs drift."""

__version__ = "0.1.0"
