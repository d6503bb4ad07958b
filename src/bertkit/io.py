"""What every module that writes shares: atomic writes, one writer per directory, disk-full errors that name the
path, the clean-up of what a killed writer left behind, and a JSON Lines reader that survives a torn last line.

- `atomic_write`: a crash leaves the old file or the whole new one, and a failed write leaves no temporary file.
- `lock_directory`: an exclusive `fcntl.flock` on a lock file inside the directory, holding the writer's pid. The
  operating system releases it when the process ends, however it ends (SIGKILL included), so a lock is never stale;
  a second writer gets `DirectoryLockedError` naming the directory and the holder's pid.
- `DiskFullError` / `disk_full_as_error`: ENOSPC (and the errors torch and safetensors raise in its place) become
  one error naming the file, the bytes the write needed and the bytes free.
- `remove_stale_temporaries`: `.NAME.tmpPID` files and `.NAME.PID.XXXXXXXX` staging folders of killed writers are
  removed, and a `.NAME.old` folder whose NAME is gone (a kill between the two renames of a directory swap) is put
  back. Call it while holding the directory's lock.
- `read_json_lines`: one JSON value per line; a last line cut short (a full disk, a kill mid-write) is reported
  apart rather than raised, so that a metrics file can always be read and resumed.
- `read_json_object` / `read_json`: the one reader of a JSON file (config.json, tokenizer files, SQuAD files,
  sentence-transformers modules); every way it can be wrong is one line naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.errors import DataError

LOCK_NAME = ".bertkit.lock"  # the lock file inside a locked directory

# What writers leave while they work, by the pattern of the name (see the module docstring).
_TEMP_FILE = re.compile(r"^\..+\.tmp(\d+)$")
_STAGING_DIR = re.compile(r"^\.(.+)\.(\d+)\.[0-9a-f]{8}$")
_OLD_DIR = re.compile(r"^\.(.+)\.old$")


# ------------------------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------------------------
class DirectoryLockedError(OSError):
    """Another process is writing the directory; `str(err)` is one line naming it and the holder's pid."""

    def __init__(self, message: str, directory: Path, pid: int | None) -> None:
        super().__init__(errno.EBUSY, message, str(directory))
        self.message, self.directory, self.pid = message, directory, pid

    def __str__(self) -> str:
        return self.message


class DiskFullError(OSError):
    """A write failed for want of space; `str(err)` names the file, the bytes needed and the bytes free."""

    def __init__(self, path: str | os.PathLike, needed: int | None, free: int | None) -> None:
        self.path, self.needed, self.free = Path(path), needed, free
        need = f"it needs {_size(needed)}" if needed is not None else "the write did not fit"
        have = f", {_size(free)} free on that file system" if free is not None else ""
        self.message = f"{path}: no space left on the device: {need}{have}; free some space and run again"
        super().__init__(errno.ENOSPC, self.message, str(path))

    def __str__(self) -> str:
        return self.message


def _size(n: int | None) -> str:
    """A byte count for people: "12,345 bytes" below a MiB, else "3.2 GiB (3,435,973,837 bytes)"."""
    if n is None:
        return "an unknown number of bytes"
    if n < 1 << 20:
        return f"{n:,} bytes"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"  # unreachable


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding `path` (or its nearest existing
    parent); None where that cannot be asked."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def is_disk_full(err: BaseException) -> bool:
    """Whether `err`, or an error it was raised from or during, says the device is full (ENOSPC, EDQUOT).

    torch.save reports a failed write as a RuntimeError whose context holds the OSError; safetensors as a
    SafetensorError whose message carries "os error 28".
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(err)
        if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
            return True
        err = err.__cause__ or err.__context__
    return False


@contextlib.contextmanager
def disk_full_as_error(path: str | os.PathLike, needed: int | None,
                       temporaries: tuple[str | os.PathLike, ...] = ()) -> Iterator[None]:
    """Run the body (a write of about `needed` bytes to `path`); on failure remove `temporaries` (files or
    folders), then raise `DiskFullError` if the device is full, or else the original error.

    Where the error does not say why (torch's stream writer reports a short write as "unexpected pos"), it is taken
    for a full device when fewer than `needed` bytes are free once the temporaries are gone.
    """
    try:
        yield
    except Exception as err:
        for temporary in temporaries:
            _remove(Path(temporary))
        free = free_bytes(Path(path).parent)
        if is_disk_full(err) or (needed is not None and free is not None and free < needed
                                 and isinstance(err, (OSError, RuntimeError))):
            raise DiskFullError(path, needed, free) from None
        raise


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


# ------------------------------------------------------------------------------------------------------------------
# Atomic writes
# ------------------------------------------------------------------------------------------------------------------
def temporary_name(path: str | os.PathLike) -> Path:
    """Where `atomic_write` (and other atomic writers) stage `path`: `.NAME.tmpPID` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def atomic_write(path: Path, payload: bytes | str | memoryview) -> None:
    """Write via a temporary file in the same folder, fsync, rename (text is written as UTF-8).

    On any failure the temporary file is removed; a full device raises `DiskFullError` naming `path`.
    """
    path = Path(path)
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    tmp = temporary_name(path)
    with disk_full_as_error(path, memoryview(data).nbytes, temporaries=(tmp,)):
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)


def append_line(path: Path, line: str) -> None:
    """Append `line` + newline to a text file, unbuffered; on failure (a full device) cut the file back to its
    previous length, so no torn line is left, and raise (`DiskFullError` when the device is full)."""
    path = Path(path)
    data = memoryview((line + "\n").encode("utf-8"))
    with disk_full_as_error(path, len(data)):
        with open(path, "ab", buffering=0) as handle:  # no buffer: nothing is left to fail again at close
            before = handle.seek(0, os.SEEK_END)
            try:
                while data:  # a raw write may take part of the bytes (the last ones a device has room for)
                    data = data[handle.write(data):]
            except BaseException:
                with contextlib.suppress(OSError):  # truncating frees space, so it works on a full device
                    os.truncate(path, before)
                raise


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


# ------------------------------------------------------------------------------------------------------------------
# One writer per directory
# ------------------------------------------------------------------------------------------------------------------
_HELD: dict[str, list] = {}  # real path of a lock file this process holds -> [fd, depth]


@contextlib.contextmanager
def lock_directory(directory: str | os.PathLike, name: str = LOCK_NAME) -> Iterator[Path]:
    """Hold an exclusive lock on `directory` (created if missing) for the body; yields the directory.

    The lock is `fcntl.flock` on `directory/name`, which holds the pid (and host) of its holder. The operating
    system drops it when the process ends, SIGKILL included, so no lock is ever stale. A second process (or a
    second job) raises `DirectoryLockedError` naming the directory and the holder's pid, at once, without waiting.
    Re-entrant within a process (nested calls on one directory hold one lock). The lock file is removed on a normal
    exit. `name` lets a verb that writes one file lock it alone (`.FILE.lock` beside it).

    File systems without flock support (some network mounts) run unlocked; that is said on stderr.
    """
    directory = Path(directory)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    key = os.path.realpath(path)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield directory
        finally:
            _HELD[key][1] -= 1
        return
    # What a refusal names: the directory, or the one output a `.NAME.lock` stands for.
    subject = directory if name == LOCK_NAME else directory / name[1:].removesuffix(".lock")
    fd = _acquire(path, subject)
    if fd is None:
        yield directory
        return
    _HELD[key] = [fd, 1]
    try:
        yield directory
    finally:
        del _HELD[key]
        # Unlink while still holding the lock: a process that opened the file just before takes a lock on an
        # unlinked inode, which `_acquire` detects (the inode at the path is not its own) and retries.
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)
        if created:  # a verb that failed before writing anything leaves no empty directory behind
            with contextlib.suppress(OSError):
                directory.rmdir()


def close_inherited_locks() -> None:
    """In a process forked from a lock holder (a data loader worker): close its copies of the holder's lock files.

    A forked child shares each lock (flock belongs to the open file, which the child's copy of the descriptor
    keeps open), so a holder killed by SIGKILL would leave its directory locked until its children noticed and
    ended, and an immediate `--resume` would be refused. Closing the copies (never unlocking: that would free the
    holder's lock too) leaves the lock to the holder alone."""
    for fd, _ in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


def writer_lock(directory: str | os.PathLike, is_main: bool = True) -> contextlib.AbstractContextManager:
    """`lock_directory(directory)` in the process that writes (`is_main`: rank 0 of a torchrun job, whose ranks
    are one writer), a no-op context in the others."""
    return lock_directory(directory) if is_main else contextlib.nullcontext(Path(directory))


def _acquire(path: Path, subject: Path) -> int | None:
    """The locked file descriptor of `path`, or None where flock is unsupported; a refusal names `subject`."""
    import fcntl

    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:  # the directory was just removed by a holder that had created it
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_holder(fd)
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                pid = holder[0]
                who = f"pid {pid}" if pid is not None else "a pid not yet recorded"
                if holder[1] and holder[1] != socket.gethostname():
                    who += f" on {holder[1]}"
                raise DirectoryLockedError(
                    f"{subject} is in use by another bertkit process ({who}); one writer per directory: wait "
                    f"for it to end, stop it, or choose another output", subject, pid) from None
            import sys

            print(f"bertkit: warning: cannot lock {subject} ({err.strerror}); running without a lock",
                  file=sys.stderr)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the previous holder removed the file between our open and our lock: take the new one
            os.close(fd)
            continue
        with contextlib.suppress(OSError):  # the pid only informs a second writer; a full disk must not stop us
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        return fd
    raise OSError(f"{path}: could not take the lock (the file keeps changing)")


def _read_holder(fd: int) -> tuple[int | None, str | None]:
    try:
        fields = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
        return (int(fields[0]) if fields else None), (fields[1] if len(fields) > 1 else None)
    except (OSError, ValueError):
        return None, None


def lock_holder(directory: str | os.PathLike, name: str = LOCK_NAME) -> int | None:
    """The pid holding `directory`'s lock, or None when nobody holds it (a lock file left by a killed process
    counts as free)."""
    import fcntl

    path = Path(directory) / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_holder(fd)[0] or -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def remove_stale_temporaries(*directories: str | os.PathLike) -> list[Path]:
    """Remove what killed writers left in `directories` (not recursively): `.NAME.tmpPID` files and
    `.NAME.PID.XXXXXXXX` staging folders of other processes; put a `.NAME.old` folder back as NAME when NAME is
    missing (a kill between the two renames of `bertkit.checkpoint.save_model`), else remove it.

    Call only while holding the directories' lock (no other writer is then at work). Returns what was removed or
    restored.
    """
    me = os.getpid()
    done: list[Path] = []
    for directory in map(Path, directories):
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            name = path.name
            match = _TEMP_FILE.match(name)
            if match and not path.is_dir() and int(match.group(1)) != me:
                _remove(path)
                done.append(path)
                continue
            match = _STAGING_DIR.match(name)
            if match and path.is_dir() and int(match.group(2)) != me:
                _remove(path)
                done.append(path)
                continue
            match = _OLD_DIR.match(name)
            if match and path.is_dir():
                target = directory / match.group(1)
                if not target.exists():
                    os.replace(path, target)
                else:
                    _remove(path)
                done.append(path)
    return done


# ------------------------------------------------------------------------------------------------------------------
# JSON Lines that survive a torn last line
# ------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TornLine:
    """The last line of a JSON Lines file that is not a whole JSON value: where it starts and what it holds."""

    line: int  # 1-based line number
    offset: int  # byte offset of its first byte; truncating the file there removes it
    text: str  # its start, for the message


def read_json_lines(path: str | os.PathLike) -> tuple[list[tuple[int, Any]], TornLine | None]:
    """The (line number, value) of every non-blank line of `path`, and the torn last line if there is one.

    Only the last non-blank line may be torn (cut short by a full disk or a kill mid-write: not valid JSON or
    UTF-8); it is returned apart, not parsed. A bad line before it raises DataError ("path:line: ..."): that is
    damage, not an interrupted append.
    """
    path = Path(path)
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    out: list[tuple[int, Any]] = []
    offset = 0
    for i, line in enumerate(lines):
        start, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue
        try:
            out.append((i + 1, json.loads(line.decode("utf-8"))))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if i == last:
                return out, TornLine(i + 1, start, line[:60].decode("utf-8", "replace"))
            what = err.msg if isinstance(err, json.JSONDecodeError) else "invalid UTF-8"
            raise DataError.at(path, i + 1, f"not valid JSON ({what})") from None
    return out, None


def read_json_object(path: str | os.PathLike, what: str = "JSON file",
                     error: type[ValueError] = DataError) -> dict[str, Any]:
    """The JSON object `path` holds.

    what: what the file is, for the missing-file line ("config file" -> "{path}: no such config file").
    error: the ValueError subclass raised for a file that is there but wrong (CheckpointError for a model's files).
    Raises:
        FileNotFoundError "{path}: no such {what}".
        error "{path}:{line}: invalid UTF-8 (...)", "{path}: not valid JSON at line L, column C (...)" or
        "{path}: expected a JSON object, found list": one line each, the file first.
    """
    data = read_json(path, what, error)
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def read_json(path: str | os.PathLike, what: str = "JSON file", error: type[ValueError] = DataError) -> Any:
    """The JSON value `path` holds, whatever its type (a sentence-transformers modules.json is a list); the errors
    of `read_json_object` but the last."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such {what}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:  # the line and the byte within it, as the task readers say it
        line, start = raw.count(b"\n", 0, err.start) + 1, raw.rfind(b"\n", 0, err.start) + 1
        raise error(f"{path}:{line}: invalid UTF-8 (byte 0x{raw[err.start]:02x} at byte {err.start - start} of the "
                    f"line); save the file as UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{path}: not valid JSON at line {err.lineno}, column {err.colno} ({err.msg})") from None
