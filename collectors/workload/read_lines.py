"""A long input file (a trace, a replay file) read line by line as far as a workload needs it, hashed
as it is read: its identity is the sha256 of the bytes read, never of the whole file, so a multi-GB
trace of which a window of rows is replayed costs the time of those rows (docs/CAPTURE.md "Bounds")."""
from __future__ import annotations

import hashlib
import stat
from pathlib import Path


class ReadLines:
    """The lines of `path` as text (UTF-8, a leading byte-order mark dropped), each at most `max_bytes`
    bytes (a longer one is refused at its line, never read whole); `sha256()` and `bytes_read` cover
    exactly the lines handed out so far, from the file's first byte; OSError for a file that is not a
    regular one (a pipe, a device). Use as a context manager."""

    def __init__(self, path: Path, max_bytes: int, what: str) -> None:
        self.path, self.max_bytes, self.what = path, max_bytes, what
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a pipe with no writer blocks for ever; a device may never end
            raise OSError(f"not a regular file: a pipe or a device may block or never end, and its bytes "
                          f"cannot be named by a hash and a size; save it to a file first")
        self.size = st.st_size
        self.bytes_read = 0
        self._hash = hashlib.sha256()
        self._file = open(path, "rb")

    def __enter__(self) -> "ReadLines":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def __iter__(self):
        n = 0
        while True:
            raw = self._file.readline(self.max_bytes + 1)
            if not raw:
                return
            n += 1
            if len(raw) > self.max_bytes:
                raise ValueError(f"{self.path}:{n}: a line longer than {self.max_bytes} bytes (allowed: at most "
                                 f"{self.max_bytes}: {self.what})")
            self._hash.update(raw)
            self.bytes_read += len(raw)
            yield raw.decode("utf-8-sig" if n == 1 else "utf-8")

    def sha256(self) -> str:
        return self._hash.hexdigest()

    def covered(self) -> dict:
        """What the hash covers, for the manifest: the bytes read from the start, of the file's size."""
        return {"sha256": self.sha256(), "sha256_bytes": self.bytes_read, "file_bytes": self.size}
