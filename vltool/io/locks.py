"""One writer per output: output locks, the command's `output_scope`, and cleaning what killed writes left.

Inside an `output_scope()` (every CLI command runs in one) `check_output` takes the output's lock:
`.OUT.lock` beside it, an advisory flock held until the command ends. A second writer gets a one-line
error (`OutputBusy`); the holder removes the stale `.OUT.tmp-*` / `.OUT.work-*` a killed run left beside
its output (`clean_stale`). A full disk inside the scope becomes one line naming the output (`DiskFull`).
docs/conventions.md, "Writes".
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from vltool.errors import DiskFull, UsageError, VltoolError, disk_full_cause, disk_full_message
from vltool.topology import warn


def is_main_process() -> bool:
    """Whether this is the main process of a launch (`accelerate launch`, torchrun set RANK), read from the
    environment without starting anything: only it takes output locks."""
    return os.environ.get("RANK", "0") in ("", "0")


_SCOPES: list[dict] = []  # output_scope() stack: the locks and directories taken inside each
_HELD: dict[str, "_Lock"] = {}  # resolved output path -> the lock this process holds on it

STALE_MARKS = (".tmp-", ".work-", ".old-")


class OutputBusy(VltoolError):
    """Another live process holds the output's lock."""


@dataclass
class _Lock:
    out: Path
    path: Path
    fd: int

    def release(self) -> None:
        _HELD.pop(str(self.out.resolve()), None)
        try:
            os.unlink(self.path)  # while still holding it: a waiting opener re-checks the inode
        except OSError:
            pass
        os.close(self.fd)


def lock_file(out: Path | str) -> Path:
    out = Path(out).expanduser()
    return out.parent / f".{out.name}.lock"


@contextmanager
def output_scope() -> Iterator[None]:
    """Locks taken by check_output inside the block are held until it ends; directories it created for an
    output are removed again (when empty) if the block fails. Every CLI command runs in one."""
    scope: dict = {"locks": [], "created": []}
    _SCOPES.append(scope)
    ok = False
    try:
        yield
        ok = True
    except Exception as e:
        full = None if isinstance(e, VltoolError) else disk_full_cause(e)
        if full is None:
            raise
        raise DiskFull(disk_full_message(_written_path(full, [lk.out for lk in scope["locks"]]))) from e
    finally:
        _SCOPES.remove(scope)
        for lk in reversed(scope["locks"]):
            lk.release()
        if not ok:
            for d in reversed(scope["created"]):
                try:
                    d.rmdir()
                except OSError:
                    pass


def _written_path(error: BaseException, outputs: Sequence[Path]) -> str | None:
    """What a write that failed with `error` was writing, for the user: the output (`--out`) when the file
    is the output, inside it or a temporary beside it (`.OUT.tmp-*`, `.OUT.work-*`), else the file named by
    the error, else the command's outputs."""
    filename = getattr(error, "filename", None)
    if filename is None:
        return ", ".join(map(str, outputs)) or None
    failed = Path(os.fsdecode(filename)).absolute()
    for out in outputs:
        if any(p == out.absolute() or (p.parent == out.absolute().parent and p.name.startswith(f".{out.name}."))
               for p in (failed, *failed.parents)):
            return str(out)
    return str(failed)


def hold_output_lock(out: Path | str, *, related: Sequence[str] = (), keep: Sequence[Path] = ()) -> None:
    """Take `out`'s lock for the innermost output_scope (re-entrant in one process) and remove stale
    temporaries beside it. Raises OutputBusy when another live process holds it."""
    out = Path(out).expanduser()
    if not _SCOPES or str(out.resolve()) in _HELD:
        return
    _make_parents(out)
    lk = _acquire(out)
    _SCOPES[-1]["locks"].append(lk)
    removed = clean_stale(out, related=related, keep=keep)
    if removed:
        shown = ", ".join(p.name for p in removed[:3]) + (", ..." if len(removed) > 3 else "")
        warn(f"removed what {len(removed)} killed or stopped write(s) of {out} left beside it ({shown})")


def _make_parents(out: Path) -> None:
    missing = []
    p = out.parent
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        except OSError as e:
            raise UsageError(f"--out {out}: cannot create {d} ({e.strerror})") from None
        if _SCOPES:
            _SCOPES[-1]["created"].append(d)


def _acquire(out: Path) -> _Lock:
    import fcntl  # POSIX only: imported where a lock is taken, so the module still imports elsewhere

    path = lock_file(out)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UsageError(f"--out {out}: cannot write in {path.parent} ({e.strerror}); choose another --out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            busy = _busy_error(out, fd) if e.errno in LOCK_HELD_ERRNOS else None
            os.close(fd)
            if busy is not None:
                raise busy from None
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # else the previous holder removed the file between our open and flock: take the new one
            break
        os.close(fd)
    _write_holder(fd, path, out)
    lk = _Lock(out, path, fd)
    _HELD[str(out.resolve())] = lk
    return lk


LOCK_HELD_ERRNOS = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)  # flock(LOCK_NB) on a lock another process holds


def _busy_error(out: Path, fd: int) -> OutputBusy:
    """The error for a second writer of `out`, naming the holder's pid from the lock file (`fd`) when readable."""
    try:
        holder = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        holder = ""
    return OutputBusy(f"{out} is being written by another vltool process{f' (pid {holder})' if holder.isdigit() else ''}; "
                      "wait for it to finish or choose another --out")


def refuse_if_busy(out: Path | str) -> None:
    """Raise OutputBusy when another live process holds `out`'s lock (looked at without taking it): a second
    writer of `out` is told that, not what the first one's output looks like half made (a run directory
    with run.json only, a directory vltool "did not write")."""
    import fcntl  # (POSIX only: see _acquire)

    out = Path(out).expanduser()
    if str(out.resolve()) in _HELD:
        return
    try:
        fd = os.open(lock_file(out), os.O_RDONLY)
    except OSError:  # no lock file: nobody writes `out`
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in LOCK_HELD_ERRNOS:
            raise _busy_error(out, fd) from None
    finally:
        os.close(fd)


def _write_holder(fd: int, path: Path, out: Path) -> None:
    """Write this process's id into the lock file `path` (held through `fd`) for a second writer's message.
    When it cannot be written (a full disk), the lock file is removed and closed: nothing is left beside
    `out`, and the error names `out`."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:
        with suppress(OSError):
            os.unlink(path)
        os.close(fd)
        raise OSError(e.errno, e.strerror, str(out)) from None


def clean_stale(out: Path | str, *, related: Sequence[str] = (), keep: Sequence[Path] = ()) -> list[Path]:
    """Remove what killed writes of `out` (and of the `related` files beside it) left: `.NAME.tmp-*`,
    `.NAME.work-*`; a `.NAME.old-*` (an output moved aside while being replaced) is removed when NAME
    exists and moved back when it does not. Call only while holding `out`'s lock."""
    out = Path(out).expanduser()
    parent = out.parent
    keep_ = {Path(k).resolve() for k in keep}
    removed = []
    for name in [out.name, *related]:
        olds = []
        for p in parent.glob(f".{_glob_escape(name)}.*-*"):
            mark = next((m for m in STALE_MARKS if p.name.startswith(f".{name}{m}")), None)
            if mark is None or p.resolve() in keep_:
                continue
            if mark == ".old-":
                olds.append(p)
                continue
            _remove(p)
            removed.append(p)
        target = parent / name
        for p in sorted(olds, key=lambda q: q.stat().st_mtime, reverse=True):
            if not target.exists() and not target.is_symlink():
                os.rename(p, target)  # the swap was cut between its two renames: the old output comes back
            else:
                _remove(p)
                removed.append(p)
    return removed


def _glob_escape(name: str) -> str:
    return glob.escape(name)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


@contextmanager
def _write_lock(out: Path) -> Iterator[None]:
    """Hold `out`'s lock while writing it: the command's own when it has one, else taken for the write."""
    if str(out.resolve()) in _HELD or not is_main_process():
        yield
        return
    lk = _acquire(out)
    try:
        clean_stale(out)
        yield
    finally:
        lk.release()

