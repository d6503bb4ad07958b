"""Durable file writes shared by every module that writes: a crash leaves the old file or the whole new one."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, payload: bytes | str) -> None:
    """Write via a temporary file in the same folder, fsync, rename (text is written as UTF-8)."""
    path = Path(path)
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def fsync_dir(directory: Path) -> None:
    """Make a folder's entries (renames) durable; a no-op where the platform or file system cannot."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
