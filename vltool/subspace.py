"""Concept subspaces: find one with PCA, remove it from embeddings, read one back from `vltool debias --out`.

The math of concept editing in CLIP-Lite ("CLIP-Lite: Information Efficient Visual Representation
Learning with Language Supervision", section 4.8, Table 6), after Bolukbasi et al. (hard debias) and
Liang et al. (sentence contextualisation). A leaf module (numpy, vltool.errors): `vltool debias` computes
and measures subspaces with it, and the evaluation commands (`--debias`) apply one with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vltool.errors import UsageError

SUBSPACE_FILE = "subspace.npy"  # V (k, D), next to the subspace directory's vltool.json


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


def load_subspace(path: Path | str, model_fingerprint: str | None = None, option: str = "--debias") -> np.ndarray:
    """V (k, D) from a subspace directory; refuses a subspace made with another model. `option`: the option
    that named it (--debias of an evaluation, --subspace of `vltool debias`)."""
    path = Path(path)
    f = path / SUBSPACE_FILE
    meta = path / "vltool.json"
    if not f.is_file() or not meta.is_file():
        raise UsageError(f"{option} {path}: not a subspace directory written by `vltool debias --out` (no {SUBSPACE_FILE})")
    try:  # (a leaf: the few lines of vltool.checks.read_json, not an import of it)
        info = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{option} {path}: cannot read {meta} ({e}); is it damaged?") from None
    if not isinstance(info, dict):
        raise UsageError(f"{option} {path}: {meta} is not a provenance record; is it damaged?")
    fp = info.get("stats", {}).get("model_fingerprint")
    if model_fingerprint is not None and fp != model_fingerprint:
        raise UsageError(
            f"{option} {path} was computed with another model (fingerprint {fp}, this model {model_fingerprint}); "
            "make it with this model: `vltool debias --model MODEL --out DIR`, and give that DIR"
        )
    return np.load(f, allow_pickle=False)
