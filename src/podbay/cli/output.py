"""One output object for every command: text for people, ``--json`` for scripts.

Commands never print directly; they hand values to :class:`Output`.
Expected failures are one line on stderr and a non-zero exit, never a
traceback (see :func:`fail`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from podbay.wire.codec import encode


class Output:
    def __init__(
        self, *, as_json: bool = False, out: TextIO | None = None, err: TextIO | None = None
    ) -> None:
        self.as_json = as_json
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def value(self, data: Any, text: str | None = None) -> None:
        """One result: JSON of ``data`` with ``--json``, else ``text`` (or JSON)."""
        if self.as_json or text is None:
            self.out.write(json.dumps(encode(data), indent=None if self.as_json else 2) + "\n")
        else:
            self.out.write(text if text.endswith("\n") else text + "\n")
        self.out.flush()

    def table(
        self, rows: Sequence[Sequence[Any]], headers: Sequence[str], data: Any = None
    ) -> None:
        """Rows as aligned columns, or ``data`` as JSON with ``--json``."""
        if self.as_json:
            self.value(
                data if data is not None else [dict(zip(headers, r, strict=True)) for r in rows]
            )
            return
        cells = [[str(h) for h in headers]] + [
            ["" if c is None else str(c) for c in r] for r in rows
        ]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        for row in cells:
            self.out.write(
                "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n"
            )
        self.out.flush()

    def line(self, text: str) -> None:
        """Plain text for people; suppressed with ``--json``."""
        if not self.as_json:
            self.out.write(text + "\n")
            self.out.flush()

    def info(self, text: str) -> None:
        """Progress and notes: always stderr, so stdout stays parseable."""
        self.err.write(text + "\n")
        self.err.flush()

    def raw(self, data: str | bytes) -> None:
        """Stream a command's own output through unchanged."""
        if isinstance(data, bytes):
            self.out.buffer.write(data)
        else:
            self.out.write(data)
        self.out.flush()


def fail(message: str, code: int = 1) -> NoReturn:
    """An expected failure: one line on stderr, exit ``code``."""
    sys.stderr.write(f"podbay: {message}\n")
    sys.stderr.flush()
    raise SystemExit(code)
