"""The test-only rule: built-in held-out data (`emoji-openmoji`), or data made from it, is refused as
training input unless `--allow-test-data` is given (then recorded, with a warning).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from vltool.errors import UsageError, VltoolError
from vltool.io.builtin import BUILTIN_DATASETS, TEST_ONLY_DATASETS
from vltool.io.records import read_provenance
from vltool.topology import warn

if TYPE_CHECKING:  # (an annotation only)
    from vltool.io.loading import LoadedDataset


def test_only_origin(loaded: "LoadedDataset") -> str | None:
    """The built-in test-only dataset (TEST_ONLY_DATASETS) `loaded` is, or was made from (its provenance
    chain, inputs[].path, followed as LoadedDataset.reads follows it), else None."""
    marks = {BUILTIN_DATASETS[name].resolve(): name for name in TEST_ONLY_DATASETS}
    seen, todo = set(), [Path(loaded.path)]
    while todo and len(seen) < 64:
        p = todo.pop()
        try:
            p = p.expanduser().resolve()
        except (OSError, RuntimeError):
            continue
        if p in marks:
            return marks[p]
        if p in seen:
            continue
        seen.add(p)
        try:
            rec = read_provenance(p) if p.is_dir() else None
        except VltoolError:  # a damaged record of an upstream dataset: nothing more to follow
            rec = None
        todo += [Path(i["path"]) for i in (rec or {}).get("inputs") or [] if isinstance(i, dict) and isinstance(i.get("path"), str)]
    return None


def test_only_inputs(loaded: Sequence["LoadedDataset"], role: str, allow: bool, option: str = "--allow-test-data") -> list[str]:
    """The inputs of `loaded` that are built-in test-only data (or made from it): a usage error naming the
    first, as `role` (e.g. "training input"), unless `allow` (`option`, recorded with the command's options;
    then a warning). Returns the spec of each such input, for the record."""
    found = [(src.spec, name) for src in loaded if (name := test_only_origin(src)) is not None]
    if not found:
        return []
    spec, name = found[0]
    made = "" if spec == name else f" (made from the built-in {name!r})"
    if not allow:
        raise UsageError(
            f"{spec!r}{made} is test-only data: the held-out emoji drawn in another art style, for evaluation only; "
            f"it is not a {role}. Train on other data, or pass {option} to use it anyway (recorded)"
        )
    warn(f"{spec!r}{made} is test-only data, used as {role} because of {option}")
    return [s for s, _ in found]

