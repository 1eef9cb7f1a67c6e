"""`vltool debias`: find a concept subspace with language alone and remove it from embeddings.

CLIP-Lite ("CLIP-Lite: Information Efficient Visual Representation Learning with Language Supervision",
section 4.8, Table 6) after Bolukbasi et al. (hard debias) and Liang et al. (sentence contextualisation):
1. each concept pair (man, woman) goes through sentence templates, giving sentence pairs that differ
   only in the concept word;
2. the sentences are encoded into the shared space; each pair is centred on its own mean;
3. the top k principal components of the centred vectors are the subspace V;
4. an embedding is edited as h' = h - sum_j <h, v_j> v_j, then renormalised.

The subspace math (Subspace, concept_subspace, project_out, load_subspace) is vltool.subspace's, a leaf
module the evaluation commands use too; this module is the command: concept pairs, templates, the
alignment table, saving a subspace, and the two modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vltool import provenance
from vltool.cache import EmbeddingCache
from vltool.checks import require_decoded
from vltool.encode import encode_images, encode_prompts, load_eval_model, model_record
from vltool.errors import UsageError
from vltool.evaluation import check_out, finish
from vltool.io.atomic import atomic_output, write_json_atomic
from vltool.io.loading import load_dataset
from vltool.io.outputs import check_output, model_inputs
from vltool.subspace import SUBSPACE_FILE, Subspace, concept_subspace, load_subspace, project_out  # noqa: F401 (re-exported)
from vltool.zeroshot import ZeroshotConfig, zeroshot
from vltool.topology import computes

ASSETS = Path(__file__).resolve().parent / "assets" / "debias"
DEFAULT_PAIRS = ASSETS / "gender_pairs.txt"
DEFAULT_TEMPLATES = ASSETS / "templates.txt"


def read_pairs(path: Path | str) -> list[tuple[str, str]]:
    """One pair per line, two words separated by a tab or a comma; blank lines and '#' comments skipped."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--pairs {path}: no such file")
    pairs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in (line.split("\t") if "\t" in line else line.split(","))]
        if len(parts) != 2 or not all(parts):
            raise UsageError(f"--pairs {path}, line {n}: expected two words separated by a tab or a comma, got {line!r}")
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise UsageError(f"--pairs {path} holds no pairs")
    return pairs


def read_templates(path: Path | str) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--templates {path}: no such file")
    templates = [t.strip() for t in path.read_text().splitlines() if t.strip() and not t.startswith("#")]
    bad = [t for t in templates if t.count("{}") != 1]
    if bad or not templates:
        raise UsageError(f"--templates {path}: every line needs exactly one {{}} (bad: {bad[:2]})" if bad else f"--templates {path} is empty")
    return templates


def contextualise(pairs: list[tuple[str, str]], templates: list[str]) -> tuple[list[str], list[str]]:
    """Sentence pairs that differ only in the concept word: (first group's sentences, second group's)."""
    a = [t.format(p) for p, _ in pairs for t in templates]
    b = [t.format(q) for _, q in pairs for t in templates]
    return a, b


def alignment_table(
    queries: np.ndarray, query_groups: list[str], images: np.ndarray, image_groups: list[str], top: int = 10
) -> dict:
    """Mean alignment (cosine) of each (query group, image group) cell: for every query, the `top`
    most aligned images of each image group, averaged; then averaged over the queries of a group."""
    queries = np.asarray(queries, dtype=np.float32)
    images = np.asarray(images, dtype=np.float32)
    qg = np.asarray(query_groups)
    ig = np.asarray(image_groups)
    cells: dict = {}
    for g_img in sorted(set(ig.tolist())):
        sims = queries @ images[ig == g_img].T  # (Q, N_g)
        t = min(top, sims.shape[1])
        best = -np.sort(-sims, axis=1)[:, :t].mean(axis=1)  # (Q,) mean of each query's top-t
        for g_q in sorted(set(qg.tolist())):
            cells.setdefault(g_q, {})[g_img] = float(best[qg == g_q].mean())
    return cells


def own_other_gap(cells: dict) -> float:
    """Own-group minus other-group alignment, averaged over query groups (groups named alike)."""
    gaps = []
    for g_q, row in cells.items():
        if g_q in row and len(row) > 1:
            others = [v for g, v in row.items() if g != g_q]
            gaps.append(row[g_q] - float(np.mean(others)))
    return float(np.mean(gaps)) if gaps else float("nan")


def gap_change(before: float, after: float) -> dict:
    """The own-minus-other gap before and after the edit, and the change of its size: a gap whose sign
    flips, or that starts near 0, makes 1 - after/before meaningless (-0.0001 -> 0.0003 read "reduced by
    350%"), so the absolute gaps are compared. `gap_reduction`: 1 - |after| / |before| (None when before is 0)."""
    size_before, size_after = abs(before), abs(after)
    return {
        "gap_before": round(before, 5),
        "gap_after": round(after, 5),
        "abs_gap_before": round(size_before, 5),
        "abs_gap_after": round(size_after, 5),
        "abs_gap_change": round(size_after - size_before, 5),
        "gap_reduction": round(1 - size_after / size_before, 4) if size_before else None,
    }


# ----------------------------------------------------------------------------------------------------
# Saving a subspace (vltool.subspace.load_subspace reads it back); the command's two modes
# ----------------------------------------------------------------------------------------------------


def save_subspace(sub: Subspace, out: Path, prov: dict, overwrite: bool) -> Path:
    with atomic_output(out, overwrite) as tmp:
        np.save(tmp / SUBSPACE_FILE, sub.components)
        write_json_atomic(tmp / "vltool.json", prov)
    return Path(out)


@dataclass
class DebiasConfig:
    """Options of `vltool debias`, one field per option of the same name (help: `vltool debias --help`)."""

    model: str = ""
    pretrained: str | None = None
    pairs: str | None = None
    templates: str | None = None
    components: int = 1  # CLIP-Lite's code removes one
    subspace: str | None = None
    eval_data: str | None = None
    group_column: str = "gender"
    queries: str | None = None
    top: int = 10
    debias_text: bool = False
    zeroshot_label: str | None = None  # None: `label` when the data has it; "": no zero-shot
    batch_size: int = 64
    cache_dir: str | None = None
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda (vltool.topology.compute_scope)
    threads: int | None = None  # torch's intra-op threads (None: torch's own)

    def validate(self) -> None:
        problems = []
        if not str(self.model or "").strip():
            problems.append("--model is required")
        if self.components < 1:
            problems.append("--components must be >= 1")
        if self.top < 1:
            problems.append("--top must be >= 1")
        if self.threads is not None and self.threads < 1:
            problems.append(f"--threads must be >= 1, got {self.threads}")
        if (self.subspace is None) != (self.eval_data is None):
            problems.append("the report needs both --subspace and --eval-data (without them, debias computes a subspace)")
        for opt, val in (("--pairs", self.pairs), ("--templates", self.templates), ("--queries", self.queries)):
            if val is not None and not Path(val).expanduser().is_file():
                problems.append(f"{opt} {val}: no such file")
        if problems:
            raise UsageError("; ".join(problems))


def _check_tokenized_pairs(m, pairs: list[tuple[str, str]], template: str) -> None:
    """Every concept word must survive tokenisation, and the two words of a pair must differ once tokenised."""
    def toks(texts):
        t = m.tokenize(texts)
        return torch.as_tensor(t["input_ids"] if isinstance(t, dict) else t)

    words = sorted({w for p in pairs for w in p})
    filled = toks([template.format(w) for w in words])
    empty = toks([template.format("")])[0]
    for w, t in zip(words, filled):
        if torch.equal(t, empty):
            raise UsageError(f"the concept word {w!r} reduces to nothing once tokenised; fix the --pairs file")
    ta = toks([template.format(a) for a, _ in pairs])
    tb = toks([template.format(b) for _, b in pairs])
    for (a, b), x, y in zip(pairs, ta, tb):
        if torch.equal(x, y):
            raise UsageError(f"the pair {a!r} / {b!r} is the same once tokenised; a pair needs two different words")


@computes
def compute_subspace(config: DebiasConfig, out, *, overwrite: bool = False) -> dict:
    """Mode 1: the concept subspace of a model, saved to `out`."""
    timer = provenance.Timer()
    config.validate()
    out = check_output(out, overwrite, [*model_inputs(config.model, config.pretrained), *_files(config)])
    pairs = read_pairs(config.pairs or DEFAULT_PAIRS)
    templates = read_templates(config.templates or DEFAULT_TEMPLATES)
    a, b = contextualise(pairs, templates)
    m = load_eval_model(config.model, config.pretrained, config.cache_dir)
    _check_tokenized_pairs(m, pairs, templates[0])
    cache = EmbeddingCache(config.cache_dir)
    ea = encode_prompts(m, a, cache=cache).embeddings
    eb = encode_prompts(m, b, cache=cache).embeddings
    sub = concept_subspace(ea, eb, config.components)
    stats = {
        "model_fingerprint": m.fingerprint,
        "components": config.components,
        "dim": int(sub.components.shape[1]),
        "explained_variance_ratio": [round(float(v), 5) for v in sub.explained_variance_ratio],
        "pairs": [list(p) for p in pairs],
        "templates": templates,
        "sentence_pairs": len(a),
    }
    prov = provenance.make("debias", config, [], stats=stats, timer=timer)
    prov["model"] = model_record(m, config.model, config.pretrained)
    save_subspace(sub, out, prov, overwrite)
    return prov


def _files(config: DebiasConfig) -> list[Path]:
    """The files the command reads besides the model and the data (inputs: --out never replaces them)."""
    return [Path(f).expanduser() for f in (config.pairs, config.templates, config.queries, config.subspace) if f]


@dataclass
class Queries:
    """The texts whose alignment with each group's images is measured, and the group each one names."""

    groups: list[str]  # (Q,)
    texts: list[str]  # (Q,)


@dataclass
class GroupImages:
    """The decodable images of the rows whose group is a query group, and their groups."""

    embeddings: np.ndarray  # (N, D)
    groups: list[str]  # (N,)
    present: list[str]  # the groups they belong to, sorted


@computes
def measure(config: DebiasConfig, out=None, *, where=(), split=None, overwrite: bool = False) -> dict:
    """Mode 2: Table 6's alignment cells before and after the edit, the gap, and zero-shot before/after."""
    timer = provenance.Timer()
    config.validate()
    src, zs_label, out_path = load_measure_inputs(config, where, split, out, overwrite)
    m = load_eval_model(config.model, config.pretrained, config.cache_dir)
    v = load_subspace(config.subspace, m.fingerprint, option="--subspace")
    cache = EmbeddingCache(config.cache_dir)
    queries = read_queries(config)
    images = encode_group_images(m, src, cache, config, queries)
    stats = alignment_stats(m, cache, config, queries, images, v)
    if zs_label:
        stats["zeroshot"] = zeroshot_before_after(config, zs_label, where, split)
    record = provenance.make("debias", config, [src], rows_in=src.rows, stats=stats, timer=timer)
    record["model"] = model_record(m, config.model, config.pretrained)
    return finish(record, out_path, overwrite)


def load_measure_inputs(config: DebiasConfig, where, split, out, overwrite: bool):
    """(the --eval-data rows, the zero-shot label column or "" for none, --out checked against every input)."""
    src = load_dataset(config.eval_data, split=split, where=where, required=[config.group_column], images=["image"],
                       cache_dir=config.cache_dir)
    zs_label = config.zeroshot_label if config.zeroshot_label is not None else ("label" if "label" in src.dataset.column_names else "")
    if zs_label and zs_label not in src.dataset.column_names:
        raise UsageError(
            f"--zeroshot-label {config.zeroshot_label!r}: {config.eval_data!r} has no such column "
            f"(it has: {', '.join(src.dataset.column_names)}); give a label column, or --zeroshot-label '' to skip zero-shot"
        )
    out_path = check_out(out, overwrite, [*src.reads, *model_inputs(config.model, config.pretrained), *_files(config)])
    return src, zs_label, out_path


def read_queries(config: DebiasConfig) -> Queries:
    """--queries (GROUP<TAB>QUERY lines), else the concept pairs through the templates, each sentence the
    group of its word (the first pair's two words name the groups)."""
    pairs = read_pairs(config.pairs or DEFAULT_PAIRS)
    templates = read_templates(config.templates or DEFAULT_TEMPLATES)
    group_a, group_b = pairs[0]
    if config.queries:
        lines = [ln.split("\t") for ln in Path(config.queries).read_text().splitlines() if ln.strip()]
        if any(len(x) != 2 for x in lines):
            raise UsageError(f"--queries {config.queries}: every line is GROUP<TAB>QUERY")
        return Queries([x[0].strip() for x in lines], [x[1].strip() for x in lines])
    a, b = contextualise(pairs, templates)
    return Queries([group_a] * len(a) + [group_b] * len(b), a + b)


def encode_group_images(m, src, cache: EmbeddingCache, config: DebiasConfig, queries: Queries) -> GroupImages:
    """The images of the rows of a query group, encoded; no such row, no decodable image, or images of one group
    only refused."""
    qg = queries.groups
    groups = [str(g) for g in src.dataset[config.group_column]]
    keep = np.array([g in set(qg) for g in groups])  # (rows,)
    if keep.sum() == 0:
        raise UsageError(f"no row of {config.eval_data!r} has a {config.group_column!r} among the query groups {sorted(set(qg))}")
    img = encode_images(m, src, cache=cache, batch_size=config.batch_size)
    require_decoded(img.bad[keep], config.eval_data)
    keep &= ~img.bad
    x = img.embeddings[keep]  # (N, D)
    ig = [g for g, k in zip(groups, keep.tolist()) if k]
    present = sorted(set(ig))
    if len(present) < 2:
        raise UsageError(
            f"the own-minus-other gap compares groups of {config.group_column!r}, but the selected images with a decodable "
            f"image belong to {'only ' + repr(present[0]) if present else 'no group'} of the query groups {sorted(set(qg))}; "
            "select rows of at least two groups"
        )
    return GroupImages(x, ig, present)


def alignment_stats(m, cache: EmbeddingCache, config: DebiasConfig, queries: Queries, images: GroupImages, v) -> dict:
    """Each (query group, image group) cell before and after the edit (the images edited, the queries too with
    --debias-text), and the own-minus-other gap's change; a gap no query group defines is refused."""
    qg, ig = queries.groups, images.groups
    q = encode_prompts(m, queries.texts, cache=cache).embeddings  # (Q, D)
    before = alignment_table(q, qg, images.embeddings, ig, config.top)
    after = alignment_table(project_out(q, v) if config.debias_text else q, qg, project_out(images.embeddings, v), ig, config.top)
    gap_b, gap_a = own_other_gap(before), own_other_gap(after)
    if not (np.isfinite(gap_b) and np.isfinite(gap_a)):
        raise UsageError(
            f"the own-minus-other gap is undefined: no query group is also an image group of {config.group_column!r} "
            f"(query groups {sorted(set(qg))}, image groups {images.present}); name the query groups as the column does (--queries)"
        )
    cells = {
        gq: {gi: {"before": round(before[gq][gi], 5), "after": round(after[gq][gi], 5), "delta": round(after[gq][gi] - before[gq][gi], 5)}
             for gi in before[gq]}
        for gq in before
    }
    return {
        "group_column": config.group_column,
        "images_per_group": {g: ig.count(g) for g in sorted(set(ig))},
        "queries_per_group": {g: qg.count(g) for g in sorted(set(qg))},
        "top": config.top,
        "top_used": {g: min(config.top, ig.count(g)) for g in sorted(set(ig))},  # a group with fewer images: all of them
        "cells": cells,
        **gap_change(gap_b, gap_a),
    }


def zeroshot_before_after(config: DebiasConfig, zs_label: str, where, split) -> dict:
    """Zero-shot top-1 on --eval-data without and with the edit (vltool.zeroshot, --debias)."""
    zc = dict(model=config.model, pretrained=config.pretrained, label_column=zs_label, cache_dir=config.cache_dir,
              batch_size=config.batch_size, seed=config.seed, progress=False, device=config.device, threads=config.threads)
    zb = zeroshot(config.eval_data, ZeroshotConfig(**zc), where=where, split=split)
    za = zeroshot(config.eval_data, ZeroshotConfig(**zc, debias=config.subspace, debias_text=config.debias_text), where=where, split=split)
    return {"label": zs_label, "before": zb["metrics"]["top1"], "after": za["metrics"]["top1"]}
