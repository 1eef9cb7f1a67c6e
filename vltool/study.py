"""A study's variables checked in seconds, before its first expensive step (`vltool check-study NAME=VALUE ...`).

The recipes (recipes/common.sh) run it first with every study variable the user set, so that a mistake is
refused naming the variable, before any deform, recaption or training starts: a path that does not exist
or holds the wrong kind of data for its task (labels and class names for zero-shot and the probe, captions
for retrieval), a benchmark without EVAL_SPLIT or PROBE_TRAIN_SPLIT, test-only training data, an INIT or
CAPTIONER that does not resolve, a TRAINABLE / THREADS / batch that does not parse, a LAUNCH whose program
is not installed. Each variable is declared once in VARIABLES with its check and its help (the command's
help is made from them). The data checks read each dataset's metadata, its split names and its columns,
never its images; a CLIP_benchmark folder is read from its layout, without importing it.
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vltool.errors import UsageError, VltoolError


@dataclass
class CheckStudyConfig:
    """Options of `vltool check-study`: none (its NAME=VALUE arguments are the study's variables)."""


class Refused(Exception):
    """Why a variable's value cannot be used (the message follows "NAME=VALUE: ")."""


@dataclass(frozen=True)
class Variable:
    name: str
    help: str
    check: Callable[[str, dict[str, str]], None]  # (its value, every value given) -> None, or raises Refused


VARIABLES: dict[str, Variable] = {}


def variable(name: str, help: str):
    def register(fn):
        VARIABLES[name] = Variable(name, help, fn)
        return fn

    return register


def check_study(values: dict[str, str]) -> list[str]:
    """Check each variable given (an empty value is unset, as in the recipes), in VARIABLES' order; the first
    refusal is a UsageError "NAME=VALUE: why". Returns the names checked."""
    unknown = sorted(set(values) - set(VARIABLES))
    if unknown:
        raise UsageError(f"{', '.join(unknown)}: not a study variable (they are: {', '.join(VARIABLES)})")
    checked = []
    for name, var in VARIABLES.items():
        value = values.get(name, "")
        if not value.strip():
            continue
        try:
            var.check(value, values)
        except Refused as e:
            raise UsageError(f"{name}={value}: {e}") from None
        checked.append(name)
    return checked


def parse_assignments(items: list[str]) -> dict[str, str]:
    """NAME=VALUE arguments -> {NAME: VALUE}."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            raise UsageError(f"{item!r}: expected NAME=VALUE, e.g. TRAIN_DATA=shards/")
        out[name] = value
    return out


# ---- what a dataset argument holds, from its metadata


@dataclass
class Data:
    """A dataset argument as the checks see it: its splits (None: no split, the rows are used whole), and
    per split its columns and whether its label column names its classes."""

    spec: str
    kind: str  # "dataset" | "clip_benchmark" | "shards"
    splits: list[str] | None
    columns: dict[str | None, set[str]]  # split (None: the whole data, there when the splits are a split column's values) -> its columns
    class_names: bool  # a label column with class names (ClassLabel), or CLIP_benchmark's classnames.txt
    retrieval: bool = False  # CLIP_benchmark's dataset_type.txt says retrieval

    def selection(self, split: str) -> list[str]:
        """The arguments that select `split` of these rows, as every command takes them: --split SPLIT for a
        DatasetDict or a CLIP_benchmark folder, --where split=SPLIT for a split column, none for rows without
        splits (used whole). Refused when there is no such split."""
        if self.splits is None:
            return []
        _has_split(self, split)
        return ["--where", f"split={split}"] if None in self.columns else ["--split", split]


def describe_data(spec: str) -> Data:
    """Data for a saved dataset (or `emoji`), shards, or a CLIP_benchmark folder; Refused when there is none."""
    from vltool.importer.clip_benchmark import CB_CLASSNAMES, CB_NSHARDS, CB_TYPE, clip_benchmark_layout
    from vltool.io.index import is_shard_input
    from vltool.io.loading import read_from_disk, resolve_dataset_path
    from vltool.shards import expand_shards

    path = Path(spec).expanduser()
    saved = path.is_dir() and any((path / f).is_file() for f in ("state.json", "dataset_dict.json"))
    if clip_benchmark_layout(path) is not None:
        splits = sorted(p.name for p in path.iterdir() if p.is_dir() and ((p / CB_NSHARDS).is_file() or any(p.glob("*.tar"))))
        kind = (path / CB_TYPE).read_text().strip() if (path / CB_TYPE).is_file() else "classification"
        cols = {"image", "captions", "caption"} if kind == "retrieval" else {"image", "label" if kind == "classification" else "labels"}
        return Data(spec, "clip_benchmark", splits, {s: cols for s in splits}, (path / CB_CLASSNAMES).is_file(), kind == "retrieval")
    if not saved and is_shard_input(spec):
        try:
            expand_shards(spec)
        except VltoolError as e:
            raise Refused(str(e)) from None
        return Data(spec, "shards", None, {None: {"image", "caption"}}, False)
    try:
        obj = read_from_disk(resolve_dataset_path(spec), spec)
    except VltoolError as e:
        raise Refused(str(e)) from None
    import datasets

    parts = dict(obj) if isinstance(obj, datasets.DatasetDict) else {None: obj}
    columns = {s: set(ds.column_names) for s, ds in parts.items()}
    named = any(isinstance(ds.features.get("label"), datasets.ClassLabel) for ds in parts.values())
    if None in parts:
        ds = parts[None]
        splits = sorted(map(str, set(ds.unique("split")))) if "split" in ds.column_names else None
        return Data(spec, "dataset", splits, {**({s: columns[None] for s in splits} if splits else {}), None: columns[None]}, named)
    return Data(spec, "dataset", sorted(parts), columns, named)


def _has_split(d: Data, split: str, variable: str | None = None) -> None:
    if d.splits is not None and split not in d.splits:
        raise Refused(f"{d.spec} has no {split!r} split (its splits: {', '.join(d.splits) or 'none'})"
                      + (f"; set {variable} to one of them" if variable else ""))


def _benches(value: str) -> list[str]:
    return value.split()


def _columns_of(d: Data, split: str | None) -> set[str]:
    return d.columns.get(split if d.splits is not None else None, set()) or d.columns.get(None, set())


# ---- the variables, in the order they are checked


@variable("TRAIN_DATA", "the training data: a dataset on disk, shards, or a folder of .tar files; not test-only data")
def _train_data(value: str, values: dict) -> None:
    from vltool.io.heldout import test_only_origin
    from vltool.io.loading import LoadedDataset

    d = describe_data(value)
    if d.kind == "clip_benchmark":
        raise Refused("a CLIP_benchmark folder is a benchmark, evaluated by ZEROSHOT_BENCH, RETRIEVAL_BENCH or PROBE_BENCH, not trained on")
    cols = _columns_of(d, None)
    missing = [c for c in ("image",) if c not in cols] + ([] if {"caption", "captions"} & cols else ["caption (or captions)"])
    if missing:
        raise Refused(f"training needs an image and a caption per row; it has no {', '.join(missing)} column (it has: {', '.join(sorted(cols))})")
    if d.kind == "dataset":
        from vltool.io.loading import resolve_dataset_path

        origin = test_only_origin(LoadedDataset(value, resolve_dataset_path(value), None, [], "", 0, None))
        if origin is not None:
            made = "" if value == origin else f" (made from the built-in {origin!r})"
            raise Refused(f"test-only data{made}: the held-out style, for evaluation only; train on other data")


@variable("TRAIN_WHERE", "--where clauses of the training rows, space-separated (COLUMN=VALUE or COLUMN!=VALUE)")
def _train_where(value: str, values: dict) -> None:
    from vltool.io.loading import Where

    for clause in value.split():
        try:
            Where.parse(clause)
        except VltoolError as e:
            raise Refused(str(e)) from None


def _eval_split(values: dict) -> str:
    return values.get("EVAL_SPLIT") or "test"


@variable("ZEROSHOT_BENCH", "zero-shot benchmarks, space-separated: labelled data with class names, each with an EVAL_SPLIT split")
def _zeroshot(value: str, values: dict) -> None:
    for b in _benches(value):
        d = describe_data(b)
        _labelled(d, "zero-shot")
        _has_split(d, _eval_split(values), "EVAL_SPLIT")


@variable("RETRIEVAL_BENCH", "retrieval benchmarks, space-separated: images with captions, each with an EVAL_SPLIT split")
def _retrieval(value: str, values: dict) -> None:
    for b in _benches(value):
        d = describe_data(b)
        if not d.retrieval and not {"caption", "captions"} & _columns_of(d, _eval_split(values)):
            raise Refused(f"{b} has no captions (a caption or captions column, or CLIP_benchmark's retrieval type): retrieval needs them")
        _has_split(d, _eval_split(values), "EVAL_SPLIT")


@variable("PROBE_BENCH", "linear-probe benchmarks, space-separated: labelled data with a PROBE_TRAIN_SPLIT and an EVAL_SPLIT split")
def _probe(value: str, values: dict) -> None:
    fit = values.get("PROBE_TRAIN_SPLIT") or "train"
    for b in _benches(value):
        d = describe_data(b)
        _labelled(d, "the linear probe")
        if d.splits is None:
            raise Refused(f"{b} has no splits: the probe is fitted on its {fit!r} split (PROBE_TRAIN_SPLIT) and scored on EVAL_SPLIT")
        _has_split(d, fit, "PROBE_TRAIN_SPLIT")
        _has_split(d, _eval_split(values), "EVAL_SPLIT")


def _labelled(d: Data, task: str) -> None:
    if d.retrieval:
        raise Refused(f"{d.spec} is a retrieval set (captions, no labels): {task} needs labelled data; give it as RETRIEVAL_BENCH")
    cols = set().union(*d.columns.values()) if d.columns else set()
    if not {"label", "labels"} & cols:
        raise Refused(f"{d.spec} has no label column: {task} needs labels (it has: {', '.join(sorted(cols))})")
    if not d.class_names:
        raise Refused(f"{d.spec}'s labels name no classes (a ClassLabel column, or CLIP_benchmark's classnames.txt): {task} needs their names")


@variable("EVAL_SPLIT", "the split every benchmark is scored on (default test); checked with the benchmarks")
def _eval_split_name(value: str, values: dict) -> None:
    if not re.fullmatch(r"[\w.-]+", value):
        raise Refused("a split name (letters, digits, _ . -)")


@variable("PROBE_TRAIN_SPLIT", "the split the probe is fitted on (default train); checked with PROBE_BENCH")
def _probe_split_name(value: str, values: dict) -> None:
    _eval_split_name(value, values)


@variable("LABEL_DATA", "unicl.sh's image-label data: a labelled dataset on disk")
def _label_data(value: str, values: dict) -> None:
    d = describe_data(value)
    if not {"label", "labels"} & set().union(*d.columns.values()):
        raise Refused(f"{value} has no label column (UniCL's image-label rows need one)")


@variable("CONCEPT_DATA", "debias.sh's images the concept is measured on: a dataset on disk")
def _concept_data(value: str, values: dict) -> None:
    describe_data(value)


@variable("INIT", "a whole model to start from, every spelling `pretrain --init` takes")
def _init(value: str, values: dict) -> None:
    from vltool.model.load import check_init

    try:
        check_init(value)
    except VltoolError as e:
        raise Refused(str(e).removeprefix(f"--init {value}: ")) from None


@variable("CAPTIONER", "caption-worth.sh's image captioner: a local model directory (BLIP, ...) with its config.json")
def _captioner(value: str, values: dict) -> None:
    path = Path(value).expanduser()
    if not path.is_dir():
        raise Refused("no such directory: give a local captioning model (e.g. one saved with save_pretrained)")
    if not (path / "config.json").is_file():
        raise Refused(f"{path} holds no config.json: not a model saved with save_pretrained")


@variable("TRAINABLE", "projections | image-last-N (N a positive whole number) | all")
def _trainable(value: str, values: dict) -> None:
    if not re.fullmatch(r"projections|all|image-last-[1-9][0-9]*", value):
        raise Refused("use projections, image-last-N (N a positive whole number, e.g. image-last-2) or all")


def _positive(value: str, what: str) -> int:
    if not re.fullmatch(r"[1-9][0-9]*", value):
        raise Refused(f"{what}, a positive whole number")
    return int(value)


@variable("THREADS", "torch threads of every command, a positive whole number")
def _threads(value: str, values: dict) -> None:
    _positive(value, "the torch threads of every command")


@variable("BATCH", "the global batch of every training run, a positive whole number")
def _batch(value: str, values: dict) -> None:
    _positive(value, "the global batch")


@variable("BATCH_SIZES", "clip-lite.sh's global batches of Table 8, space-separated")
def _batch_sizes(value: str, values: dict) -> None:
    for b in value.split():
        _positive(b, f"{b}: each a global batch")


@variable("BOOTSTRAP", "bootstrap resamples of every evaluation (0: none)")
def _bootstrap(value: str, values: dict) -> None:
    from vltool.metrics import resamples_problem

    if not re.fullmatch(r"[0-9]+", value):
        raise Refused("resamples, a whole number (0: none)")
    problem = resamples_problem(int(value))
    if problem:
        raise Refused(problem)


@variable("LAUNCH", "the launcher prefixing every training command, e.g. accelerate launch --multi_gpu --num_processes 8")
def _launch(value: str, values: dict) -> None:
    try:
        program = shlex.split(value)[0]
    except (ValueError, IndexError):
        raise Refused("not a command line") from None
    if shutil.which(program) is None:
        raise Refused(f"{program!r} is not a program on PATH (install it, or give its path)")
