"""A run directory at a URL (s3://, gs://, memory://, file://: any filesystem fsspec knows), copied
file by file to a local staging folder before the ledger reads it: DuckDB then streams local Parquet
whatever the store, and the copy goes to disk, never into memory whole."""
from __future__ import annotations

import shutil
from pathlib import Path


class RemoteRunError(ValueError):
    """The URL cannot be read as a run directory; the message names it."""


def is_url(run_dir) -> bool:
    return "://" in str(run_dir)


def stage(url: str, dest: Path) -> Path:
    """Copy the run directory at `url` into `dest` (created; replaced when it exists) and return it."""
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url)
        if not fs.isdir(root):
            raise RemoteRunError(f"{url}: no such run directory")
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        root = root.rstrip("/")
        for path in fs.find(root):
            rel = path[len(root):].lstrip("/")
            if rel.split("/")[0] in ("events", "samples") or "/" not in rel:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(path, str(dest / rel))
    except (ValueError, ImportError, OSError) as exc:
        if isinstance(exc, RemoteRunError):
            raise
        raise RemoteRunError(f"{url}: cannot read it as a run directory ({exc})") from None
    return dest
