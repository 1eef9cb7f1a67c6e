"""`vltool debias`: find a concept subspace with language alone and remove it from embeddings.

CLIP-Lite (003_1589a2ba138981a4.txt, section 4.8, Table 6) after Bolukbasi et al. (hard debias) and
Liang et al. (sentence contextualisation):
1. each concept pair (man, woman) goes through sentence templates, giving sentence pairs that differ
   only in the concept word;
2. the sentences are encoded into the shared space; each pair is centred on its own mean;
3. the top k principal components of the centred vectors are the subspace V;
4. an embedding is edited as h' = h - sum_j <h, v_j> v_j, then renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vltool.errors import UsageError

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


@dataclass
class Subspace:
    components: np.ndarray  # (k, D) orthonormal rows
    explained_variance_ratio: np.ndarray  # (k,) share of the centred pairs' variance each explains


def concept_subspace(emb_a: np.ndarray, emb_b: np.ndarray, k: int = 1) -> Subspace:
    """PCA of sentence-pair embeddings, each pair centred on its mean (Bolukbasi et al.; Liang et al.)."""
    emb_a = np.asarray(emb_a, dtype=np.float64)
    emb_b = np.asarray(emb_b, dtype=np.float64)
    if emb_a.shape != emb_b.shape:
        raise UsageError("the two groups of sentences must pair up one to one")
    if not 1 <= k <= min(emb_a.shape[1], 2 * len(emb_a)):
        raise UsageError(f"--components must be between 1 and {min(emb_a.shape[1], 2 * len(emb_a))}, got {k}")
    mean = (emb_a + emb_b) / 2  # (P, D)
    centred = np.concatenate([emb_a - mean, emb_b - mean])  # (2P, D)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    var = s**2
    return Subspace(vt[:k].astype(np.float32), (var[:k] / var.sum()).astype(np.float32))


def project_out(h: np.ndarray, components: np.ndarray) -> np.ndarray:
    """h' = h - sum_j <h, v_j> v_j, renormalised (rows of h are embeddings)."""
    h = np.asarray(h, dtype=np.float32)
    v = np.asarray(components, dtype=np.float32)  # (k, D)
    edited = h - (h @ v.T) @ v  # (N, D)
    return edited / np.maximum(np.linalg.norm(edited, axis=1, keepdims=True), 1e-12)


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
