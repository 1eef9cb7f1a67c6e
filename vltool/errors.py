"""Errors a user can fix. The CLI prints their message on one line and exits without a traceback."""

import errno
import os


class VltoolError(Exception):
    """A runtime problem the user can fix (bad data, missing file). Exit code 1."""

    exit_code = 1


class UsageError(VltoolError):
    """A bad command line: missing input, bad option value, output exists. Exit code 2."""

    exit_code = 2


def check(problems: list[str], error: type[VltoolError] = UsageError) -> None:
    """Raise once with every problem found, as litgpt's validate_args does."""
    if problems:
        raise error("; ".join(problems))


class DiskFull(VltoolError):
    """No space left on the device being written (ENOSPC, or a quota: EDQUOT). Exit code 1."""


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# How libraries that wrap the OSError in their own exception say it: safetensors' Rust I/O error
# ("No space left on device (os error 28)"), pyarrow's ("[errno 28] ...").
DISK_FULL_TEXTS = (os.strerror(errno.ENOSPC), f"os error {errno.ENOSPC}", f"errno {errno.ENOSPC}]")
# torch.save's zip writer (caffe2's PyTorchStreamWriter) reports a short write without its errno: "[enforce fail at
# inline_container.cc:NNN] . unexpected pos X vs Y", or "PytorchStreamWriter failed writing file ...": the disk (or a
# quota) filled while it wrote.
TORCH_SHORT_WRITE_TEXTS = ("unexpected pos", "PytorchStreamWriter failed writing file")


def disk_full_cause(e: BaseException) -> BaseException | None:
    """The exception in `e`'s chain (itself, then what it was raised from) that reports a full disk, or None.
    datasets' DatasetGenerationError carries the OSError as its cause; safetensors' SafetensorError says it
    only in its text; torch.save's RuntimeError as a short write (TORCH_SHORT_WRITE_TEXTS)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return e
        if any(text in str(e) for text in DISK_FULL_TEXTS):
            return e
        if isinstance(e, RuntimeError) and "inline_container" in str(e) and any(t in str(e) for t in TORCH_SHORT_WRITE_TEXTS):
            return e
        e = e.__cause__ or e.__context__
    return None


def disk_full_message(where: str | os.PathLike | None, advice: str = "free some space there or choose another --out") -> str:
    """One line saying the disk is full, naming what was being written."""
    return f"the disk is full (no space left on device){f' writing {where}' if where else ''}; {advice}"


OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)  # this machine's limits, not a bad file


def out_of_resources(e: BaseException) -> bool:
    """An OSError that says the process ran out of descriptors or memory: never a damaged file or a bad
    image to skip (every later one would be "bad" too), so it is raised."""
    return isinstance(e, OSError) and e.errno in OUT_OF_RESOURCES


def open_files_message(where: str = "", advice: str = "") -> str:
    """One line for "Too many open files" (EMFILE): the limit of open files of this process (`ulimit -n`) and
    how to raise it; `advice` is added as another way out (e.g. "or lower --workers")."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return f"too many open files{f' {where}' if where else ''}; raise the limit of open files (`ulimit -n`){f' {advice}' if advice else ''}"
    unlimited = resource.RLIM_INFINITY
    shown = "unlimited" if hard == unlimited else str(hard)
    if hard == unlimited or soft < hard:
        target = 65536 if hard == unlimited else min(hard, max(4096, 4 * soft))
        how = f"raise it in the shell that starts the run (`ulimit -n {target}`; the hard limit is {shown})"
    else:
        how = (f"the hard limit is {shown} too: raise it (`nofile` in /etc/security/limits.conf, systemd's LimitNOFILE, "
               "or docker run --ulimit nofile=65536:65536), then `ulimit -n 65536`")
    return f"too many open files{f' {where}' if where else ''}: the limit is {soft} (`ulimit -n`); {how}{f', {advice}' if advice else ''}"
