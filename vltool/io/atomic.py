"""Atomic writes: an output appears whole or not at all.

`atomic_output` gives a temporary directory beside the target and renames it into place at the end, so a
failed or interrupted run leaves nothing half-written (`replace_path` swaps an existing output out);
`work_dir` names the hidden sibling an output is built in; `atomic_file` and `write_json_atomic` do the
same for one file; `save_dataset` writes a dataset and its `vltool.json` this way; `replace_as_one`
replaces several files beside each other as one set (a report's), through a journal.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from vltool import columns as C
from vltool.errors import UsageError, VltoolError
from vltool.io.locks import _write_lock
from vltool.topology import is_main


def work_dir(out: Path | str, token: str | None = None) -> Path:
    """A hidden sibling directory in which `out` is built before it replaces `out` (`.OUT.work-TOKEN`)."""
    out = Path(out).expanduser()
    return out.parent / f".{out.name}.work-{token or uuid.uuid4().hex[:8]}"


def final_of_work_dir(path: Path | str) -> Path | None:
    """The output a work_dir() is built for, or None when `path` is not one."""
    path = Path(path)
    name = path.name
    if not name.startswith(".") or ".work-" not in name:
        return None
    return path.parent / name[1:].rsplit(".work-", 1)[0]


@contextmanager
def atomic_output(out: Path | str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory beside `out`; on success rename it to `out`.

    On any error the temporary directory is removed and `out` is untouched.
    """
    out = Path(out).expanduser()
    if out.exists() and not overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _write_lock(out):
        tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            replace_path(tmp, out, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def replace_path(src: Path, out: Path, overwrite: bool) -> None:
    """Rename `src` onto `out`; an existing `out` is moved aside first and removed after."""
    if out.exists() or out.is_symlink():
        if out.exists() and not (out.is_dir() or out.is_file()):  # a device or pipe (/dev/null) is never replaced
            raise UsageError(f"{out} is a device, pipe or socket; vltool replaces only what it wrote")
        if not overwrite:
            shutil.rmtree(src, ignore_errors=True) if src.is_dir() else src.unlink(missing_ok=True)
            raise UsageError(f"{out} exists; pass --overwrite to replace it")
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        os.rename(src, out)
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    else:
        os.rename(src, out)


@contextmanager
def atomic_file(path: Path | str) -> Iterator[Path]:
    """Yield a temporary file path beside `path` (same suffix); on success rename it to `path`."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}{path.suffix}"
    try:
        yield tmp
        if tmp.exists():
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json_atomic(path: Path | str, obj: Any, overwrite: bool = True) -> Path:
    """Write a JSON file through a temporary file and a rename."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(json.dumps(obj, indent=2, default=str, ensure_ascii=False) + "\n")
        if path.exists() and not overwrite:
            raise UsageError(f"{path} exists; pass --overwrite to replace it")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def save_dataset(ds, out: Path | str, provenance: dict, *, overwrite: bool = False, num_proc: int | None = None) -> Path:
    """Write `ds` and its `vltool.json` atomically to `out`.

    Under `accelerate launch` only the main process writes (the others return at once: no collective
    here, since some commands reach this line on the main process alone)."""
    out = Path(out).expanduser()
    if len(ds) == 0:
        raise VltoolError(f"nothing to write to {out}: no row is left (every row was filtered out or dropped)")

    if is_main():
        with atomic_output(out, overwrite) as tmp:
            # Shard writing in parallel only pays off for large data (images); it spawns processes.
            big = num_proc and num_proc > 1 and ds.data.nbytes > 2**30
            ds.save_to_disk(str(tmp), num_proc=num_proc if big else None)
            write_json_atomic(tmp / C.PROVENANCE_FILE, provenance)
    return out



# Several files beside each other replaced as one set (a report's STEM.json, .md and .png): each is written
# complete to a temporary beside its place, then a journal naming them all is written atomically: the commit
# point. The renames follow; a kill between them leaves the journal, and the next writer of the set finishes
# them (`finish_replace`) before anything else, so the set is always the old one or, once committed, the new one.
SWAP_FORMAT = "vltool-swap/1"


def swap_journal(out: Path | str) -> Path:
    """The journal of a set written beside `out` (`.NAME.swap`)."""
    out = Path(out).expanduser()
    return out.parent / f".{out.name}.swap"


def staged_path(final: Path | str, token: str) -> Path:
    """Where the new version of `final` is written before the swap (`.NAME.tmp-TOKEN.SUFFIX`: what a killed
    write leaves is a stale temporary of NAME, cleaned by its next writer)."""
    final = Path(final)
    return final.parent / f".{final.name}.tmp-{token}{final.suffix}"


def replace_as_one(staged: dict[Path, Path | None], journal: Path) -> None:
    """Replace the files `staged` maps from their final paths to their complete temporaries (None: remove
    the final file), all in one directory, as one set through `journal`."""
    entries = [[None if tmp is None else Path(tmp).name, Path(final).name] for final, tmp in staged.items()]
    write_json_atomic(journal, {"format": SWAP_FORMAT, "files": entries})
    finish_replace(journal)


def pending_replace(journal: Path) -> list[Path]:
    """The temporaries a committed, unfinished swap still has to move into place (kept from cleaning)."""
    entries = _journal_entries(journal)
    return [journal.parent / tmp for tmp, _ in entries or () if tmp is not None]


def finish_replace(journal: Path) -> list[str]:
    """Finish the swap `journal` records (idempotent: a temporary already moved is skipped); returns the
    names of the files it put in place or removed ([] without a journal)."""
    entries = _journal_entries(journal)
    if entries is None:
        return []
    done = []
    for tmp, final in entries:
        target = journal.parent / final
        if tmp is None:
            if os.path.lexists(target):
                target.unlink()
                done.append(final)
        elif os.path.lexists(journal.parent / tmp):
            os.replace(journal.parent / tmp, target)
            done.append(final)
    fd = os.open(journal.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # (the renames are on disk before the journal goes)
    finally:
        os.close(fd)
    journal.unlink(missing_ok=True)
    return done


def _journal_entries(journal: Path) -> list | None:
    try:
        record = json.loads(Path(journal).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # (none; it is written atomically, so never half)
    files = record.get("files") if isinstance(record, dict) and record.get("format") == SWAP_FORMAT else None
    ok = isinstance(files, list) and all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[1], str) and (e[0] is None or isinstance(e[0], str))
        and "/" not in e[1] and (e[0] is None or "/" not in e[0]) for e in files)
    return files if ok else None
