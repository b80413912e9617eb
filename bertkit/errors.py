"""The one exception type for bad user input: it names the file, the line and the problem."""

from __future__ import annotations


class BertkitError(Exception):
    """Bad input or an impossible request, phrased for the user (no traceback needed)."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path + (f":{self.line}" if self.line is not None else "") + ": "
        return where + self.message
