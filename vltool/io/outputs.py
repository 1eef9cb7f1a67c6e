"""Refusing a bad `--out` before any work: `check_output`.

It refuses an output that is, contains or lies inside anything the command reads (`model_inputs` names
what a --model reads) or vltool's built-in data, one whose directory cannot be written, one that is not
vltool's to replace (a device, a directory vltool did not write), and an existing one without
--overwrite; inside an `output_scope` it then takes the output's lock (vltool.io.locks).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Sequence

from vltool import columns as C
from vltool.errors import UsageError
from vltool.io.builtin import ASSETS
from vltool.io.locks import _SCOPES, hold_output_lock, is_main_process, refuse_if_busy


def model_inputs(spec: str | Path | None, pretrained: str | Path | None = None) -> list[Path]:
    """What a --model value reads, protected like an input dataset: a vltool RUN_DIR (or RUN_DIR/model)
    as given, local-dir:PATH's PATH, hf:DIR's DIR, open_clip:ARCH's weights file, and huggingface_hub's
    cache for a Hub id or an open_clip tag (its files are read from there)."""
    if spec is None or not str(spec).strip():
        return []
    s = str(spec)
    if s.startswith("open_clip:"):  # --pretrained FILE or open_clip:ARCH/FILE; a tag's or a Hub id's files are in the Hub cache
        files = [pretrained] if pretrained else [s[len("open_clip:"):].partition("/")[2]]
        local = [Path(f).expanduser() for f in files if f and Path(f).expanduser().is_file()]
        return local or (_hub_cache() if any(files) else [])
    if s.startswith("local-dir:"):
        if not s[len("local-dir:"):].strip():  # (Path("") is the current directory, which --out would then "overwrite")
            raise UsageError(f"{s!r} names no directory: expected local-dir:PATH (open_clip's local-dir layout)")
        return [Path(s[len("local-dir:"):]).expanduser()]
    if s.startswith("hf:"):  # a local folder; hf:ORG/NAME's files are in the Hub cache
        path = Path(s[len("hf:"):]).expanduser()
        if not s[len("hf:"):]:
            return []
        return [path] if path.exists() else _hub_cache()
    return [Path(s).expanduser()]


def _hub_cache() -> list[Path]:
    """huggingface_hub's cache, where a Hub id's files are read from."""
    from vltool.hub import hub_cache  # (lazy: vltool --help loads this module; huggingface_hub is not needed there)

    return [hub_cache()]


def _overlaps(out: Path, inp: Path) -> bool:
    """`out` equals `inp`, contains it, or lies inside it (symlinks resolved)."""
    resolved, inp = out.resolve(), Path(inp).expanduser().resolve()
    return resolved == inp or inp in resolved.parents or resolved in inp.parents


def check_output(
    out: Path | str,
    overwrite: bool,
    inputs: Sequence[Path | str] = (),
    *,
    related: Sequence[str] = (),
    lock: bool | None = None,
    kind: str = "dir",
    keep: Sequence[Path] = (),
) -> Path:
    """Refuse a bad output before any work, and (inside an output_scope) lock it for the command.

    Refused always, --overwrite or not: an output that is, contains or lies inside one of `inputs` (every
    path the command reads: datasets, models, subspaces, files), or vltool's built-in data. Refused: an
    output whose directory cannot be written (a file on the way, read-only, no permission), and an existing
    output without `overwrite`. `related` are the names of other files written beside `out` (stale
    temporaries of theirs are cleaned too, but for `keep`); `lock` (default: the main process) takes the lock.

    `kind` is what the command writes at `out`: a directory ("dir") or a file ("file"). Refused always, as
    nothing vltool writes could replace it: a device, pipe or socket (`--out /dev/null`), and for a
    directory output an existing file or a non-empty directory vltool did not write (`--out ~`).
    """
    out = require_output_name(out)
    for inp in inputs:
        if inp is None or not str(inp).strip():
            continue
        if _overlaps(out, Path(inp)):
            raise UsageError(
                f"--out {out} would overwrite the input {Path(inp).expanduser().resolve()}; inputs are never modified: choose another --out"
            )
    resolved = out.resolve()
    if resolved == ASSETS or ASSETS in resolved.parents:
        raise UsageError(f"--out {out} is inside vltool's built-in data; choose another --out")
    check_writable(out)
    locks = lock if lock is not None else is_main_process()  # the process that locks `out` (of a launch: the main one)
    if locks:  # (the other processes of a launch find `out` locked by their own main process)
        refuse_if_busy(out)
    not_ours = _not_replaceable(out, kind)
    if not_ours:
        raise UsageError(f"--out {out} {not_ours}; vltool replaces only what it wrote (even with --overwrite): choose another --out")
    if out.exists() and not overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    if _SCOPES and locks:
        hold_output_lock(out, related=related, keep=keep)
    return out


# What marks a directory as an output of vltool (or a dataset, which vltool reads and writes alike).
OUTPUT_MARKS = (C.PROVENANCE_FILE, "state.json", "dataset_dict.json", "run.json")


def _not_replaceable(out: Path, kind: str) -> str | None:
    """Why an existing `out` may not be replaced by a `kind` output ("dir" or "file"), or None."""
    try:
        mode = os.stat(out).st_mode  # (through a symlink: what it points to)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be inspected ({e.strerror})"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "is a device, pipe or socket, not a file or directory"
    if kind == "dir" and stat.S_ISREG(mode):
        return "is an existing file, not an output directory"
    if kind == "dir" and stat.S_ISDIR(mode):
        try:
            entries = os.listdir(out)
        except OSError as e:
            return f"cannot be listed ({e.strerror})"
        if entries and not any(m in entries for m in OUTPUT_MARKS):
            return f"is a directory vltool did not write (no {C.PROVENANCE_FILE}; it holds {len(entries)} entries)"
    return None


def require_output_name(out: Path | str) -> Path:
    """`out`, or an error when it names no new file or directory: "" (which arrives as "."), ".", "..", "/"."""
    out = Path(out).expanduser()
    if out.name in ("", ".", ".."):
        raise UsageError(f"--out {str(out)!r} names no new file or directory (the current, a parent or the root directory); "
                         "give a name, e.g. --out results/NAME")
    return out


def check_writable(out: Path | str) -> None:
    """A one-line error when `out` cannot be created: a file where a directory should be, or a directory
    that is read-only or not ours to write."""
    out = Path(out).expanduser().absolute()
    p = out.parent
    while not p.exists() and not p.is_symlink() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise UsageError(f"--out {out}: {p} is not a directory, so nothing can be written under it")
    why = not_writable(p)
    if why:
        raise UsageError(f"--out {out}: cannot write in {p} ({why}); choose another --out")


def not_writable(p: Path | str) -> str | None:
    """Why the directory `p` cannot be written in ("read-only file system", "permission denied"), or None."""
    if os.access(p, os.W_OK | os.X_OK) and not _read_only_fs(Path(p)):
        return None
    return "read-only file system" if _read_only_fs(Path(p)) else "permission denied"


def _read_only_fs(p: Path) -> bool:
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except OSError:
        return False

