"""Server-sent events, decoded as the WHATWG spec says: bytes in any split, `data` payloads out.

Lines end with CR LF, LF or CR. A CR at the end of one read ends its line at once (the event is not
held back), and an LF that opens the next read is then the second half of that CR LF, not a blank
line. An event is dispatched
at a blank line; its `data:` lines are joined with a line feed (one JSON object may span several);
one space after the colon is dropped; comment lines (`:` first) and other fields (`event`, `id`,
`retry`) carry nothing a completion stream needs and are skipped. What a payload means (JSON, the
`[DONE]` sentinel) is the transport's business, not this decoder's.
"""
from __future__ import annotations

import re

_EOL = re.compile(rb"[\r\n]")


class SSEDecoder:
    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._after_cr = False  # the last read ended with CR: an LF first in the next one belongs to it

    def feed(self, chunk: bytes) -> list[str]:
        """The data of every event completed by `chunk`, in order."""
        if self._after_cr and chunk[:1] == b"\n":
            chunk, self._after_cr = chunk[1:], False
        if chunk:
            self._after_cr = chunk.endswith(b"\r")
        self._buf += chunk
        out: list[str] = []
        while True:
            m = _EOL.search(self._buf)
            if m is None:
                return out
            i = m.start()
            line = self._buf[:i]
            step = 2 if self._buf[i:i + 2] == b"\r\n" else 1
            self._buf = self._buf[i + step:]
            self._line(line, out)

    def _line(self, line: bytes, out: list[str]) -> None:
        if not line:
            if self._data:
                out.append(b"\n".join(self._data).decode("utf-8", "replace"))
                self._data = []
            return
        if line.startswith(b":"):
            return
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)

    def close(self) -> list[str]:
        """At the end of the stream: an event not closed by a blank line is incomplete and dropped (spec)."""
        self._buf, self._data = b"", []
        return []
