"""Data-loader workers that fail end the run in one line, never a hang (docs/pretrain.md, "The data path").

torch's DataLoader notices a worker that died (its SIGCHLD handler, and a look at the workers every 5
seconds while the trainer waits for a batch) and re-raises in the trainer what a worker's dataset code
raised. What it does not notice is a worker that is alive but has lost a batch: a worker's batch is
pickled and sent by the worker's queue-feeder thread, and its shared-memory descriptor is handed over by
the worker's resource-sharer thread; a failure in either (the descriptor cannot be opened or duplicated:
"Too many open files") is printed as a traceback and the batch is dropped, and the trainer waits for it
for ever. That was the hang of shard training under a low `ulimit -n`.

- `worker_init` (every trainer DataLoader's worker_init_fn): a failure in one of those threads ends the
  worker at once, silently, with the failure's errno as its exit status (LOST when it has none). The
  trainer then finds a dead worker within seconds (a receipt waiting on the worker's descriptor ends
  at its exit).
- `guarded(loader)`: the loader's batches; a dead worker (killed by a signal, or ended by worker_init),
  torch's "Too many open files", and a worker's exception that says so become one VltoolError naming the
  cause (for open files: the limit, `ulimit -n`, and how to raise it). Any other exception from a worker
  passes as torch re-raised it (the CLI shows the worker's own message in one line).
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing.queues
import os
import re
import signal
import sys
import threading
import time

from vltool.errors import VltoolError, open_files_message

LOST = 255  # a worker's exit status when a batch could not be sent for a reason without an errno
WORKER_ADVICE = "or lower --workers"
SIGNAL_HINTS = {
    signal.SIGKILL: "the kernel's out-of-memory killer sends it when memory runs out: lower --workers or --batch-size",
    signal.SIGBUS: "the shared memory (/dev/shm) the workers pass batches through is likely full: enlarge it "
                   "(docker run --shm-size) or lower --workers",
}


# ---- in each worker


def worker_init(worker_id: int) -> None:
    """In each data-loader worker, before it sends anything: a failure of the threads that send its batches
    ends the worker (its exit status the errno) instead of a traceback and a batch the trainer waits for."""
    multiprocessing.queues.Queue._on_queue_feeder_error = staticmethod(_feeder_failed)  # read when the feeder starts
    sys.excepthook = _thread_failed  # the resource-sharer thread reports its failures through sys.excepthook
    threading.excepthook = lambda args: end_worker(args.exc_value)


def _feeder_failed(e: BaseException, obj) -> None:
    end_worker(e)


def _thread_failed(kind, value, tb) -> None:
    end_worker(value)


def end_worker(e: BaseException | None) -> None:
    """End this worker now, with nothing printed (the trainer says what happened)."""
    os._exit(exit_status(e))


def exit_status(e: BaseException | None) -> int:
    """A worker's exit status for the failure `e`: its errno (an OSError's, or the one torch's shared-memory
    errors end with, "... Too many open files (24)"), else LOST."""
    no = getattr(e, "errno", None)
    if not isinstance(no, int) or no <= 0:
        found = re.search(r"\((\d+)\)\s*$", str(e or ""))
        no = int(found.group(1)) if found else None
    return no if no is not None and 0 < no < LOST else LOST


# ---- in the trainer


def guarded(loader):
    """The batches of `loader` (a torch DataLoader); a failed worker is one VltoolError (loader_failure)."""
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except VltoolError:
            raise
        except Exception as e:
            message = loader_failure(e, getattr(it, "_workers", ()))
            if message is None:
                raise
            _shut_down(it)
            raise VltoolError(message) from e
        yield batch


def loader_failure(e: BaseException, workers=()) -> str | None:
    """One line naming why the loader failed, or None when `e` is not a failure of the loader's workers.
    `workers`: the loader's worker processes (multiprocessing.Process), whose exit statuses say the cause."""
    text = " ".join(str(x) for x in _chain(e))
    dead = _dead(workers, wait=isinstance(e, (EOFError, ConnectionError)) or "DataLoader worker (pid" in text)
    for pid, status in dead:
        if status < 0:
            return _killed(pid, -status)
    for pid, status in dead:
        if status == errno.EMFILE:
            return open_files_message(f"in data-loader worker {pid}", WORKER_ADVICE)
    if _says_open_files(text):
        return open_files_message("in the data loader", WORKER_ADVICE)
    if dead:
        return _exited(*dead[0])
    said = dead_worker_message(text)
    if said is not None:
        return said
    if isinstance(e, (EOFError, ConnectionError)) or "Pin memory thread exited unexpectedly" in text:
        return f"the data-loader workers stopped answering ({type(e).__name__}{': ' + str(e) if str(e) else ''}); rerun with --workers 0 to see why"
    return None


def dead_worker_message(text: str) -> str | None:
    """One line from torch's own words on a dead worker ("DataLoader worker (pid 7) is killed by signal:
    Killed.", "... exited unexpectedly with exit code 24. ...", "... exited unexpectedly"), or None."""
    found = re.search(r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\) (is killed by signal: ([^.]*)|exited unexpectedly( with exit code (\d+))?)", text)
    if found is None:
        return None
    pid = found.group(1).split(",")[0].strip()
    if found.group(3) is not None:
        names = {signal.strsignal(s): s for s in signal.Signals if signal.strsignal(s)}
        signum = names.get(found.group(3).strip())
        return _killed(pid, signum) if signum is not None else f"data-loader worker {pid} was killed by a signal ({found.group(3).strip()})"
    if found.group(5) is not None:
        status = int(found.group(5))
        if status == errno.EMFILE:
            return open_files_message(f"in data-loader worker {pid}", WORKER_ADVICE)
        return _exited(pid, status)
    return f"data-loader worker {pid} exited unexpectedly; rerun with --workers 0 to see why"


@contextlib.contextmanager
def one_line_failures():
    """torch's SIGCHLD handler raises a dead worker's RuntimeError wherever the trainer is (in a step too, not
    only while it waits for a batch): the same one line as `guarded` gives."""
    try:
        yield
    except RuntimeError as e:
        message = dead_worker_message(" ".join(str(x) for x in _chain(e)))
        if message is None:
            raise
        raise VltoolError(message) from e


def _exited(pid, status: int) -> str:
    if status == LOST:
        return f"data-loader worker {pid} could not send a batch to the trainer and stopped; rerun with --workers 0 to see why"
    cause = f" ({os.strerror(status)})" if status in (errno.ENFILE, errno.ENOMEM, errno.ENOSPC) else ""
    return f"data-loader worker {pid} exited unexpectedly with status {status}{cause}; rerun with --workers 0 to see why"


def _chain(e: BaseException | None):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _says_open_files(text: str) -> bool:
    return f"{os.strerror(errno.EMFILE)}" in text.replace(os.strerror(errno.ENFILE), "") or f"[Errno {errno.EMFILE}]" in text


def _dead(workers, wait: bool) -> list[tuple[int, int]]:
    """(pid, exit status: negative for a signal) of the workers that have ended. With `wait`, a worker still
    ending (the trainer saw its connection close first) is given a moment, at most 2 seconds in all."""
    deadline = time.monotonic() + (2.0 if wait else 0.0)
    dead = []
    for w in workers:
        try:
            w.join(timeout=max(0.0, deadline - time.monotonic()))
            status = w.exitcode
        except (AssertionError, ValueError, OSError):  # (a process object that cannot be joined from here)
            continue
        if status not in (None, 0):
            dead.append((w.pid, status))
    return dead


def _killed(pid, signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    hint = SIGNAL_HINTS.get(signum)
    return f"data-loader worker {pid} was killed by {name}{f' ({hint})' if hint else ''}"


def _shut_down(it) -> None:
    """Stop the loader's other workers now and drop what they sent (its descriptors), so that nothing
    after the one line fails for want of a descriptor."""
    shut = getattr(it, "_shutdown_workers", None)
    if shut is not None:
        try:
            shut()
        except Exception:
            pass
