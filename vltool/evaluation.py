"""What `zeroshot`, `retrieve` and `probe` share: loading the model, the results record, the table.

A results record (written by `--out`, printed by `--json`) holds the provenance fields at top level
(vltool.provenance.make) and:
    "task", "model" {spec, pretrained, fingerprint, source}, "data" {...}, "protocol" {...},
    "metrics" {name: {"value", "ci_low", "ci_high", "chance"}}, "chance" {...}, and task-specific parts.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from vltool.errors import UsageError
from vltool.metrics import Interval

LEVEL = 0.95


@dataclass
class EvalCommon:
    """Options every evaluation command has."""

    model: str = ""  # vltool RUN_DIR or RUN_DIR/model, open_clip:ARCH (with pretrained), local-dir:PATH
    pretrained: str | None = None  # local open_clip weights file for open_clip:ARCH
    bootstrap: int = 1000  # bootstrap resamples for the 95% intervals (0: no intervals)
    seed: int = 0  # seed of the bootstrap (and of any sampling)
    batch_size: int = 64  # images per encoding batch
    num_proc: int = 1  # threads decoding and preprocessing images ahead of the model
    cache_dir: str | None = None  # embedding cache [default: $VLTOOL_CACHE, else ~/.cache/vltool]
    progress: bool = True  # progress bars on stderr
    debias: str | None = None  # a subspace directory from `vltool debias`: edit image embeddings with it
    debias_text: bool = False  # with --debias: edit the text embeddings too

    def common_problems(self) -> list[str]:
        problems = []
        if not str(self.model or "").strip():
            problems.append("--model is required (a vltool RUN_DIR, open_clip:ARCH with --pretrained FILE, or local-dir:PATH)")
        if self.bootstrap < 0:
            problems.append(f"--bootstrap must be >= 0, got {self.bootstrap}")
        if self.batch_size < 1:
            problems.append(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.num_proc < 1:
            problems.append(f"--num-proc must be >= 1, got {self.num_proc}")
        if self.debias_text and not self.debias:
            problems.append("--debias-text needs --debias SUBSPACE_DIR")
        if self.debias and not Path(self.debias).expanduser().is_dir():
            problems.append(f"--debias {self.debias}: no such subspace directory (make one with `vltool debias --out`)")
        if self.pretrained is not None and not str(self.model).startswith("open_clip:"):
            problems.append("--pretrained applies to --model open_clip:ARCH only")
        return problems


def load_eval_model(spec: str, pretrained: str | None = None, cache_dir: str | Path | None = None):
    """The model to evaluate, on this process's device.

    A vltool model directory is opened lazily (LazyModel): when the cache already knows the fingerprint of
    its files, nothing is built until something has to be encoded, so a run served from the cache does
    not pay for building the towers. open_clip:ARCH and local-dir:PATH are loaded at once; open_clip:ARCH
    without --pretrained is a randomly initialised model, loaded with a warning.
    """
    from vltool.encode import encode_device
    from vltool.model import load_model

    spec = str(spec)
    if spec.startswith("open_clip:") and pretrained is None:
        warn(f"{spec} without --pretrained evaluates randomly initialised weights")
    if not spec.startswith(("open_clip:", "local-dir:")):
        from vltool.model import resolve_model_dir

        return LazyModel(resolve_model_dir(spec), cache_dir)
    return load_model(spec, pretrained=pretrained, device=encode_device())


class LazyModel:
    """A vltool model directory whose towers are built on first use (vltool.model.load_model's LoadedModel).

    `fingerprint` (the model's weight fingerprint, vltool.model.fingerprint) is remembered in
    `<cache-dir>/models/<sha256 of config.json and model.safetensors>.json` after the first load: the file
    contents determine the fingerprint, so a later run reads it back without building the model.
    """

    def __init__(self, model_dir: Path, cache_dir: str | Path | None = None):
        import hashlib
        import json

        from vltool.cache import EmbeddingCache
        from vltool.model import CONFIG_FILE, WEIGHTS_FILE

        self._loaded = None
        self.model_dir = Path(model_dir)
        self.source = str(self.model_dir)
        config_bytes = (self.model_dir / CONFIG_FILE).read_bytes()
        self.config = json.loads(config_bytes)
        h = hashlib.sha256(config_bytes)
        with open(self.model_dir / WEIGHTS_FILE, "rb") as f:
            for chunk in iter(lambda: f.read(2**22), b""):
                h.update(chunk)
        self._index = EmbeddingCache(cache_dir).root / "models" / f"{h.hexdigest()}.json"
        try:
            self.fingerprint = json.loads(self._index.read_text())["fingerprint"]
        except (OSError, ValueError, KeyError):
            self.fingerprint = self._load().fingerprint

    def _load(self):
        if self._loaded is None:
            from vltool.encode import encode_device
            from vltool.io import write_json_atomic
            from vltool.model import load_model

            self._loaded = load_model(str(self.model_dir), device=encode_device())
            self.fingerprint = self._loaded.fingerprint  # (self.config stays the file's: keys never depend on loading)
            if is_main():
                write_json_atomic(self._index, {"fingerprint": self.fingerprint, "model_dir": str(self.model_dir)})
        return self._loaded

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def __getattr__(self, name: str):  # everything else (model, preprocess, encode_image, ...) needs the model
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._load(), name)


def model_record(m, spec: str, pretrained: str | None) -> dict:
    return {
        "spec": str(spec),
        "pretrained": str(pretrained) if pretrained else None,
        "fingerprint": m.fingerprint,
        "source": getattr(m, "source", None),
        "arch": m.config.get("arch"),
        "embed_dim": m.config.get("embed_dim"),
        "preprocess": m.config.get("preprocess"),
    }


def is_main() -> bool:
    from vltool.encode import process_state

    return process_state().is_main_process


def warn(message: str) -> None:
    if is_main():
        print(f"warning: {message}", file=sys.stderr)


def entry(value: float, interval: Interval | None, chance: float | None) -> dict:
    def clean(x):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)

    return {
        "value": clean(value),
        "ci_low": clean(interval.low) if interval else None,
        "ci_high": clean(interval.high) if interval else None,
        "chance": clean(chance),
    }


def bootstrap_record(n_boot: int, seed: int, unit: str) -> dict:
    return {
        "resamples": n_boot,
        "seed": seed,
        "level": LEVEL,
        "method": "percentile",
        "unit": unit,
    }


def check_out(out: str | Path | None, overwrite: bool, inputs: Sequence[Path]) -> Path | None:
    """Refuse a bad --out before any work (exists without --overwrite, inside an input, a directory)."""
    if out is None:
        return None
    from vltool.io import check_output

    p = check_output(out, overwrite, inputs)
    if p.is_dir():
        raise UsageError(f"--out {p} is a directory; give a file name such as results.json")
    return p


def finish(record: dict, out: Path | None, overwrite: bool) -> dict:
    """Write the record to --out (main process only, atomically)."""
    if out is not None and is_main():
        from vltool.io import write_json_atomic

        write_json_atomic(out, record, overwrite=overwrite)
    return record


def fmt_value(x: float | None, kind: str) -> str:
    if x is None:
        return "-"
    if kind == "pct":
        return f"{100 * x:.2f}%"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def print_table(record: dict, title: str) -> None:
    """The metrics with their intervals and chance level, as a rich table on stdout."""
    from rich.table import Table

    from vltool.console import out as stdout

    t = Table(title=title, show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column(f"{int(LEVEL * 100)}% CI", justify="right")
    t.add_column("chance", justify="right")
    for name, e in record["metrics"].items():
        kind = "num" if "rank" in name else "pct"
        ci = "-" if e["ci_low"] is None else f"{fmt_value(e['ci_low'], kind)} - {fmt_value(e['ci_high'], kind)}"
        t.add_row(name, fmt_value(e["value"], kind), ci, fmt_value(e["chance"], kind))
    stdout.print(t)
    extra = record.get("chance", {}).get("majority_class")
    if extra is not None:
        stdout.print(f"majority-class rate: {100 * extra:.2f}%", highlight=False)


def debias_edit(m, config: EvalCommon):
    """The concept edit of `--debias` (vltool.debias.project_out with the saved subspace), or None.

    Returns (edit_images, edit_texts, record): functions on (N, D) arrays (identity where not asked)."""
    if not config.debias:
        return None
    from vltool.debias import load_subspace, project_out

    v = load_subspace(config.debias, m.fingerprint)  # refuses another model's subspace

    def edit(x):
        return project_out(x, v)

    def keep(x):
        return x

    record = {"subspace": str(config.debias), "components": int(v.shape[0]), "text": bool(config.debias_text)}
    return edit, (edit if config.debias_text else keep), record

