"""Follow a growing file while its job runs: complete lines only, as they arrive.

The recorder appends whole lines with single writes, but a poll can still
land between two writes: an unfinished last line waits in the buffer until
its newline arrives.
"""

from __future__ import annotations

from pathlib import Path


class LineFollower:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lines = 0  # complete non-empty lines seen so far
        self._offset = 0
        self._partial = b""

    def new_lines(self) -> list[bytes]:
        """The complete lines written since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        lines = [line for line in lines if line.strip()]
        self.lines += len(lines)
        return lines
