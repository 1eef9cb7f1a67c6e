"""`vltool mine-positives`: FFF's positive mining over the whole dataset.

"FFF: Fixing Flawed Foundations in contrastive pre-training", sections 4.1 and 4.3, equation 1.

Image i and the text of row j are a positive pair when

    M_ij = (S_it[i,j] > p1) OR (S_ii[i,j] > p2) OR ((S_tt[i,j] > p3) AND (S_it[i,j] > p1'))

with cosine similarities from a pretrained model. Every pair with M_ij = 1 is found over the whole
dataset with faiss range searches (exact inner-product index by default), in chunks of queries, so
memory grows with rows x (embedding size + positives per row), never with rows squared.

Several captions per row (section 4.3), vltool's reading:
- S_ii is per row, shared by all its captions;
- S_tt[i,j] is the mean of the similarities of every caption of row i with every caption of row j,
  which equals the dot product of the rows' mean caption embeddings;
- S_it[i,j] is the highest similarity of image i with any caption of row j (row j's text is a positive
  for image i when one of its captions is).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vltool import columns as C
from vltool import provenance
from vltool.cache import EmbeddingCache
from vltool.checks import missing_text_warning, require_decoded, require_unique_ids
from vltool.console import Bar
from vltool.derived import ColumnSpill, add_columns, spill_beside
from vltool.encode import encode_device, encode_images, encode_texts, load_eval_model, model_record
from vltool.errors import UsageError, VltoolError
from vltool.io.atomic import save_dataset
from vltool.io.digests import arrow_column, column_values
from vltool.io.loading import load_dataset
from vltool.io.locks import output_scope
from vltool.io.outputs import check_output, model_inputs
from vltool.topology import computes, process_state, warn

# torch, faiss, datasets, pyarrow and accelerate are imported inside the functions that use them: vltool/commands/
# mine_positives.py imports this module at its top, and `vltool --help` must not load them.

# FFF's thresholds, chosen for its model (its implementation details, section 5); p1 sits below the true pairs'
# mean S_it, 0.29 (appendix B).
P_IT, P_II, P_TT, P_IT_TT = 0.27, 0.92, 0.99, 0.24
TERMS = ("it", "ii", "tt")


@dataclass
class Thresholds:
    p_it: float = P_IT  # p1: image-text
    p_ii: float = P_II  # p2: image-image
    p_tt: float = P_TT  # p3: text-text, together with ...
    p_it_tt: float = P_IT_TT  # p1': ... a looser image-text threshold
    terms: str = "it,ii,tt"  # the terms of M used (FFF Table 5 ablates them): it = S_it > p1, ii = S_ii > p2, tt = third

    def validate(self) -> None:
        problems = [f"--{k.replace('_', '-')} must be in [-1, 1], got {v}" for k, v in vars(self).items()
                    if k != "terms" and not -1 <= v <= 1]
        bad = set(self.enabled) - set(TERMS)
        if bad or not self.enabled:
            problems.append(f"--terms {self.terms!r}: a comma-separated subset of {', '.join(TERMS)}")
        if problems:
            raise UsageError("; ".join(problems))

    @property
    def enabled(self) -> list[str]:
        return [t.strip() for t in self.terms.split(",") if t.strip()]


@dataclass
class Mined:
    """For each row i, the rows j whose text is a positive for image i, and the three scores of each pair, as
    flat arrays: row i's pairs are offsets[i]:offsets[i+1], ordered by S_it descending. (An array per row
    and field was three Python objects a row: ~0.5 GB at 1M rows, whatever the pairs.)"""

    offsets: np.ndarray  # (N+1,) int64
    rows: np.ndarray  # (P,) int64: the row j of each pair
    pair_scores: np.ndarray  # (P, 3) float32: S_it, S_ii, S_tt
    pair_terms: np.ndarray  # (P, 3) bool: which terms of M fired
    capped_rows: int = 0  # rows that had more than max_positives and were cut
    stats: dict = field(default_factory=dict)

    @classmethod
    def from_lists(cls, positives: list, scores: list, terms: list, capped_rows: int = 0) -> "Mined":
        """From per-row arrays (P_i,), (P_i, 3), (P_i, 3)."""
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in positives])]).astype(np.int64)
        flat = lambda parts, shape, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(shape, dtype)  # noqa: E731
        return cls(offsets, flat(positives, (0,), np.int64), flat(scores, (0, 3), np.float32),
                   flat(terms, (0, 3), bool), capped_rows)

    @property
    def counts(self) -> np.ndarray:
        """(N,) positives of each row."""
        return np.diff(self.offsets)

    def row(self, i: int) -> np.ndarray:
        """(P_i,) the positives of row i."""
        return self.rows[self.offsets[i] : self.offsets[i + 1]]

    @property
    def positives(self) -> list[np.ndarray]:
        """Per row: (P_i,) its positives (views; for small data and tests)."""
        return np.split(self.rows, self.offsets[1:-1])

    @property
    def scores(self) -> list[np.ndarray]:
        return np.split(self.pair_scores, self.offsets[1:-1])

    @property
    def terms(self) -> list[np.ndarray]:
        return np.split(self.pair_terms, self.offsets[1:-1])


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def text_rows(txt: np.ndarray, owner: np.ndarray | None, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row mean caption embedding (for S_tt) and the owner row of each caption."""
    if owner is None:
        return txt, np.arange(n_rows)
    owner = np.asarray(owner, dtype=np.int64)
    counts = np.bincount(owner, minlength=n_rows).astype(np.float32)
    if (counts == 0).any():
        raise UsageError(f"{int((counts == 0).sum())} rows have no caption")
    mean = np.zeros((n_rows, txt.shape[1]), dtype=np.float32)
    np.add.at(mean, owner, txt)
    mean /= counts[:, None]  # (in place: one (N, D) array)
    return mean, owner  # (N, D) not renormalised: dot products give mean pair similarity


INDEXES = ("flat", "ivf", "blocked")
BF16_MARGIN = 0.02  # |bf16 dot - fp32 dot| of unit vectors stays far below this (inputs rounded to 8 bits, fp32 sums)
FP32_MARGIN = 1e-5  # float32 matmul vs the recheck's einsum: another order of the same sums
TILE_ELEMENTS = 1 << 24  # scores computed at once by the blocked search on a GPU: 64 MB of float32
CPU_TILE = (1024, 1024)  # queries x targets scored at once by the blocked search on a CPU (they stay in cache)


class _Blocked:
    """The blocked search's "index": the targets (N, D) on the device, compared with queries by torch matmul
    in tiles of the targets; on a GPU in bf16, on CPU in float32. It returns every pair scoring above the
    radius minus a margin that covers the low precision: the caller (_mine_block) rescores each candidate
    exactly in float32 and applies the thresholds, so the pairs are those of the exact search."""

    def __init__(self, x: np.ndarray, device=None, low_precision: bool | None = None):
        import torch

        self.device = torch.device(device) if device is not None else encode_device()
        low = self.device.type == "cuda" if low_precision is None else low_precision
        self.dtype = torch.bfloat16 if low else torch.float32
        self.margin = BF16_MARGIN if low else FP32_MARGIN
        self.x = torch.from_numpy(np.ascontiguousarray(x)).to(self.device, self.dtype)  # (N, D)
        self.cache_tiles = self.device.type == "cpu"  # CPU_TILE tiles, screened by their rows' maxima

    def range_search(self, queries: np.ndarray, radius: float):
        """faiss's range_search result layout (lims, scores, ids) for the candidates above radius - margin."""
        import torch

        q = torch.from_numpy(np.ascontiguousarray(queries)).to(self.device, self.dtype)  # (B, D)
        on_cpu = self.cache_tiles
        qb, tile = CPU_TILE if on_cpu else (max(len(q), 1), max(1, TILE_ELEMENTS // max(len(q), 1)))
        cut = radius - self.margin
        qs, js = [], []
        # one buffer for every tile's scores: a new 4 MB tensor per tile fragments the CPU heap (RSS grew
        # with the tiles); a GPU's caching allocator reuses its blocks anyway
        buf = torch.empty(min(qb, len(q)) * min(tile, len(self.x)), dtype=self.dtype, device=self.device)
        with torch.inference_mode():
            for c in range(0, len(q), qb):
                for a in range(0, len(self.x), tile):
                    qt, xt = q[c : c + qb], self.x[a : a + tile]
                    s = torch.mm(qt, xt.T, out=buf[: len(qt) * len(xt)].view(len(qt), len(xt)))
                    s = s.float()  # (qb, tile): fp32 accumulation in either dtype (a copy only from bf16)
                    rows = None
                    if on_cpu:  # most rows of a cache-sized tile hold no candidate: look only in those that do
                        rows = (s.amax(dim=1) > cut).nonzero().squeeze(1)  # (k,)
                        if len(rows) == 0:
                            continue
                        s = s.index_select(0, rows)  # (k, tile)
                    qi, j = (s > cut).nonzero(as_tuple=True)
                    qs.append((qi if rows is None else rows[qi]).cpu().numpy() + c)
                    js.append(j.cpu().numpy() + a)
        if not qs:
            return np.zeros(len(q) + 1, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64)
        qi, j = np.concatenate(qs).astype(np.int64), np.concatenate(js).astype(np.int64)
        order = np.argsort(qi, kind="stable")
        lims = np.concatenate([[0], np.cumsum(np.bincount(qi, minlength=len(q)))])
        return lims, np.zeros(len(qi), np.float32), j[order]  # (scores are recomputed exactly by the caller)


class _Flat:
    """The exact search: faiss's brute-force inner-product range search over `x` itself (N, D) float32,
    what IndexFlatIP.range_search runs (the same pairs and scores), without the index's copy of x."""

    def __init__(self, x: np.ndarray):
        self.x = np.ascontiguousarray(x, dtype=np.float32)  # (a reference when x is already so: no copy)

    def range_search(self, queries: np.ndarray, radius: float):
        import faiss

        q = np.ascontiguousarray(queries, dtype=np.float32)  # (B, D)
        res = faiss.RangeSearchResult(len(q))
        faiss.range_search_inner_product(faiss.swig_ptr(q), faiss.swig_ptr(self.x), self.x.shape[1], len(q), len(self.x), float(radius), res)
        lims = faiss.rev_swig_ptr(res.lims, len(q) + 1).copy()
        n = int(lims[-1])
        return lims, faiss.rev_swig_ptr(res.distances, n).copy(), faiss.rev_swig_ptr(res.labels, n).copy()


def _index(x: np.ndarray, kind: str, nprobe: int):
    if kind == "blocked":
        return _Blocked(x)
    if kind == "flat":
        return _Flat(x)
    import faiss

    d = x.shape[1]
    if kind == "ivf":
        nlist = max(1, min(int(4 * np.sqrt(len(x))), len(x) // 39))
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(0)
        sample = x[rng.choice(len(x), size=min(len(x), nlist * 64), replace=False)]
        index.train(sample)
        index.nprobe = min(nprobe, nlist)
    else:
        raise UsageError(f"--index must be {', '.join(INDEXES)}, got {kind!r}")
    index.add(x)
    return index


def _range(index, queries: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query, target, score) of every pair with score > radius."""
    lims, scores, ids = index.range_search(queries, float(radius))
    q = np.repeat(np.arange(len(queries), dtype=np.int64), np.diff(lims).astype(np.int64))
    return q, ids.astype(np.int64), scores


def mine(
    img: np.ndarray,
    txt: np.ndarray,
    owner: np.ndarray | None = None,
    thresholds: Thresholds | None = None,
    *,
    max_positives: int = 256,
    index: str = "flat",
    nprobe: int = 32,
    chunk: int = 2048,
    query_rows: np.ndarray | None = None,
    pair_budget: int = 2_000_000,
    progress: bool = False,
    normalised: bool = False,
    spill=None,
) -> Mined:
    """All positives of M over the whole set.

    img: (N, D) image embeddings; txt: (N, D) text embeddings, or (N_txt, D) with owner (N_txt,) giving
    each caption's row. Embeddings are L2-normalised here. `query_rows` limits the images whose
    positives are returned (all rows by default); candidates are still every row.

    Memory is bounded by `pair_budget`, not by the data: queries go in blocks of at most `chunk`, made
    smaller when the search hits are many (a weak model puts most pairs near the thresholds), so that a
    block holds about `pair_budget` candidate pairs; their scores are computed in slices of that size.
    `progress`: a progress bar over the query images on stderr. `normalised`: img and txt are L2-normalised
    float32 already (as `_normalise` makes them), and are used as they are, not copied. `spill`: a directory
    for the mined pairs (they are memory-mapped from files there; see _Collector), or None to keep them in
    memory.
    """
    th = thresholds or Thresholds()
    th.validate()
    collector = _Collector(th, max_positives, rescore=False, n_rows=len(img), spill=spill)
    stats = _search(img, txt, owner, th, [collector], index=index, nprobe=nprobe, chunk=chunk, query_rows=query_rows,
                    pair_budget=pair_budget, progress=progress, normalised=normalised)
    return collector.result(stats)


def mine_grid(img: np.ndarray, txt: np.ndarray, owner: np.ndarray | None, grid: list[Thresholds], *, max_positives: int = 256,
              index: str = "flat", nprobe: int = 32, chunk: int = 2048, pair_budget: int = 2_000_000,
              normalised: bool = False) -> list[Mined]:
    """`mine` at every thresholds of `grid` (--dry-run) in one search: the candidates at the loosest
    thresholds of the grid are scored once, and each grid point keeps its own pairs (its terms recomputed
    from the exact scores) and caps them, block by block. Equal to [mine(..., th) for th in grid]."""
    for th in grid:
        th.validate()
    loose = Thresholds(min(t.p_it for t in grid), min(t.p_ii for t in grid), min(t.p_tt for t in grid),
                       min(t.p_it_tt for t in grid), ",".join(t for t in TERMS if any(t in g.enabled for g in grid)))
    collectors = [_Collector(th, max_positives, rescore=True, n_rows=len(img)) for th in grid]
    stats = _search(img, txt, owner, loose, collectors, index=index, nprobe=nprobe, chunk=chunk, pair_budget=pair_budget,
                    normalised=normalised)
    return [c.result(stats) for c in collectors]


def row_dtype(n: int):
    """The dtype of mined row numbers for n rows: int32 while it holds them (half of int64's 8 bytes a pair)."""
    return np.int32 if n < np.iinfo(np.int32).max else np.int64


class _Collector:
    """Each query's positives under thresholds `th` (rescore: the terms recomputed from the exact scores of
    a looser search), capped at `max_positives` by S_it; kept as flat arrays, a few per block, or, with
    `spill` (a directory), appended block by block to files there and memory-mapped back by result(): the
    pairs, which grow with the rows times the positives per row, are then the files' pages, which the
    kernel can drop, not the process's memory."""

    FIELDS = ("rows", "pair_scores", "pair_terms")

    def __init__(self, th: Thresholds, max_positives: int, rescore: bool, *, n_rows: int, spill=None):
        self.th, self.max_positives, self.rescore = th, max_positives, rescore
        self.dtypes = {"rows": row_dtype(n_rows), "pair_scores": np.float32, "pair_terms": np.bool_}
        self.parts: list = []  # per block: (counts (B,), rows (P,), scores (P, 3), terms (P, 3))
        self.capped = 0
        self.files = None
        if spill is not None:
            self.files = {f: Path(spill) / f"{f}.bin" for f in self.FIELDS}
            self.handles = {f: open(path, "wb") for f, path in self.files.items()}

    def add(self, n_queries: int, pq, pj, sc, tm) -> None:
        if self.rescore:
            th = self.th
            use_it, use_ii, use_tt = (t in th.enabled for t in TERMS)
            tm = np.stack([(sc[:, 0] > th.p_it) & use_it, (sc[:, 1] > th.p_ii) & use_ii,
                           (sc[:, 2] > th.p_tt) & (sc[:, 0] > th.p_it_tt) & use_tt], axis=1)  # (P, 3)
            m = tm.any(axis=1)
            pq, pj, sc, tm = pq[m], pj[m], sc[m], tm[m]  # (the order, by query then S_it, is kept)
        bounds = np.searchsorted(pq, np.arange(n_queries + 1))  # (B+1,) each query's pairs, by S_it descending
        counts = np.diff(bounds)
        self.capped += int((counts > self.max_positives).sum())
        keep = np.arange(len(pq)) - bounds[pq] < self.max_positives  # (P,) a query's first max_positives pairs
        # copies (boolean indexing and astype): a slice would keep the whole block's arrays alive
        part = (np.minimum(counts, self.max_positives), pj[keep].astype(self.dtypes["rows"]),
                sc[keep].astype(np.float32, copy=False), tm[keep])
        if self.files is None:
            self.parts.append(part)
            return
        self.parts.append((part[0],))  # the counts (per query) stay in memory, the pairs go to the files
        for f, a in zip(self.FIELDS, part[1:]):
            self._append(f, a)

    def _pairs(self) -> dict:
        """Every block's pairs, one flat array per field (memory-mapped from the files when spilled)."""
        total = sum(int(p[0].sum()) for p in self.parts)
        shapes = {"rows": (total,), "pair_scores": (total, 3), "pair_terms": (total, 3)}
        if self.files is None:  # a field at a time, each block's arrays let go once joined (not two copies of all)
            lists = {f: [p[k] for p in self.parts] for k, f in enumerate(self.FIELDS, start=1)}
            self.parts = [(p[0],) for p in self.parts]
            return {f: np.concatenate(lists.pop(f)) if total else np.zeros(shapes[f], self.dtypes[f]) for f in self.FIELDS}
        for h in self.handles.values():
            h.flush()
        if total == 0:  # (a file of no bytes cannot be mapped)
            return {f: np.zeros(shapes[f], self.dtypes[f]) for f in self.FIELDS}
        return {f: np.memmap(self.files[f], dtype=self.dtypes[f], mode="r", shape=shapes[f]) for f in self.FIELDS}

    def state(self) -> tuple:
        """What this process collected, in memory, for gathering across processes."""
        if self.files is None:
            return self.parts, self.capped
        pairs = self._pairs()
        return [(np.concatenate([p[0] for p in self.parts]), *(np.array(pairs[f]) for f in self.FIELDS))], self.capped

    def merge(self, states: list) -> None:
        parts = [part for st in states for part in st[0]]
        self.capped = sum(st[1] for st in states)
        if self.files is None:
            self.parts = parts
            return
        for h in self.handles.values():
            h.seek(0)
            h.truncate()
        self.parts = []
        for part in parts:
            self.parts.append((part[0],))
            for f, a in zip(self.FIELDS, part[1:]):
                self._append(f, a)

    def _append(self, field: str, a: np.ndarray) -> None:
        """`a`'s bytes at the end of the field's file, written through the file object: a full disk is then an
        OSError(ENOSPC) (where ndarray.tofile says only "N requested and M written")."""
        self.handles[field].write(np.ascontiguousarray(a).data)

    def result(self, stats: dict) -> Mined:
        counts = np.concatenate([p[0] for p in self.parts]) if self.parts else np.zeros(0, np.int64)
        pairs = self._pairs()
        if self.files is not None:
            for h in self.handles.values():
                h.close()
        return Mined(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), pairs["rows"], pairs["pair_scores"],
                     pairs["pair_terms"], self.capped, stats=dict(stats))


def _search(img, txt, owner, th: Thresholds, collectors: list, *, index: str, nprobe: int, chunk: int,
            query_rows=None, pair_budget: int, progress: bool = False, normalised: bool = False) -> dict:
    """The candidate search and exact scoring at thresholds `th`, block by block, each block's pairs handed
    to every collector. Returns the blocks' statistics."""
    if not normalised:
        img = _normalise(img)
        txt = _normalise(txt)
    n = len(img)
    if owner is None and len(txt) != n:
        raise UsageError(f"{n} images but {len(txt)} texts; give each caption's row")
    tmean, owner_idx = text_rows(txt, owner, n)
    ctx = _MineContext(img, txt, tmean, owner_idx, owner is not None, th, _index(txt, index, nprobe), _index(img, index, nprobe))
    qrows = np.arange(n) if query_rows is None else np.asarray(query_rows, dtype=np.int64)
    state = process_state()
    world, rank = (state.num_processes, state.process_index) if index == "blocked" else (1, 0)
    if world > 1:  # the blocked search spreads the queries over processes: rank r mines its contiguous share
        qrows = qrows[rank * len(qrows) // world : (rank + 1) * len(qrows) // world]
    lo, size, blocks, largest = 0, min(chunk, 64), 0, 0  # a small first block measures the hits per query
    bar = Bar("mining", len(qrows), unit="images", enabled=progress)
    while lo < len(qrows):
        q_idx = qrows[lo : lo + size]  # (B,) global image index of each query
        pq, pj, sc, tm, hits = _mine_block(ctx, q_idx, pair_budget)
        for c in collectors:
            c.add(len(q_idx), pq, pj, sc, tm)
        lo += len(q_idx)
        bar.advance(len(q_idx))
        blocks, largest = blocks + 1, max(largest, hits)
        per_query = max(hits / max(len(q_idx), 1), 1.0)
        size = int(max(1, min(chunk, pair_budget // per_query)))
    bar.close()
    if world > 1:  # every process gets the whole result, in query order (each query's positives are its own)
        from accelerate.utils import gather_object

        parts = sorted(gather_object([(rank, [c.state() for c in collectors], blocks, largest)]), key=lambda p: p[0])
        for k, c in enumerate(collectors):
            c.merge([p[1][k] for p in parts])
        blocks, largest = sum(p[2] for p in parts), max(p[3] for p in parts)
    return {"blocks": blocks, "largest_block_hits": largest}


@dataclass
class _MineContext:
    img: np.ndarray  # (N, D) normalised
    txt: np.ndarray  # (N_txt, D) normalised
    tmean: np.ndarray  # (N, D) each row's mean caption embedding
    owner_idx: np.ndarray  # (N_txt,) row of each caption
    several: bool  # captions per row given by an owner array
    th: Thresholds
    txt_index: object
    img_index: object


def _mine_block(ctx: _MineContext, q_idx: np.ndarray, pair_budget: int):
    """The positives of the queries `q_idx`, sorted by query then S_it descending: (query position (P,),
    row (P,), scores (P, 3), terms (P, 3)), and the number of search hits (to size the next block)."""
    th, n = ctx.th, len(ctx.img)
    use_it, use_ii, use_tt = (t in th.enabled for t in TERMS)
    # one image->text search gives the candidates of terms 1 and 3 (both need S_it above a threshold)
    r_it = min([th.p_it] * use_it + [th.p_it_tt] * use_tt) if (use_it or use_tt) else None
    q_img = ctx.img[q_idx]  # (B, D)
    none = np.zeros(0, dtype=np.int64)
    qi, cap, _ = _range(ctx.txt_index, q_img, r_it) if r_it is not None else (none, none, None)  # image -> caption hits
    qi2, rj2, _ = _range(ctx.img_index, q_img, th.p_ii) if use_ii else (none, none, None)  # image -> image hits
    hits = len(qi) + len(qi2)
    pair = np.unique(np.concatenate([qi * n + ctx.owner_idx[cap], qi2 * n + rj2]))  # candidate (query, row) pairs
    del qi, cap, qi2, rj2
    pq, pj = pair // n, pair % n
    keep = pj != q_idx[pq]  # a row is never its own positive
    pq, pj = pq[keep], pj[keep]
    kept_q, kept_j, kept_s, kept_t = [], [], [], []
    for a in range(0, len(pq), pair_budget):  # the three scores of every candidate pair, a slice at a time
        sq, sj = pq[a : a + pair_budget], pj[a : a + pair_budget]
        gi = q_idx[sq]
        if ctx.several:  # best caption of row j
            s_it = _max_caption_score(ctx.img, ctx.txt, ctx.owner_idx, gi, sj)
        else:
            s_it = np.einsum("nd,nd->n", ctx.img[gi], ctx.txt[sj])
        s_ii = np.einsum("nd,nd->n", ctx.img[gi], ctx.img[sj])
        s_tt = np.einsum("nd,nd->n", ctx.tmean[gi], ctx.tmean[sj])
        t1 = (s_it > th.p_it) & use_it
        t2 = (s_ii > th.p_ii) & use_ii
        t3 = (s_tt > th.p_tt) & (s_it > th.p_it_tt) & use_tt
        m = t1 | t2 | t3
        kept_q.append(sq[m])
        kept_j.append(sj[m])
        kept_s.append(np.stack([s_it[m], s_ii[m], s_tt[m]], axis=1).astype(np.float32))
        kept_t.append(np.stack([t1[m], t2[m], t3[m]], axis=1))
    if not kept_q:
        return none, none, np.zeros((0, 3), np.float32), np.zeros((0, 3), bool), hits
    pq, pj, sc, tm = np.concatenate(kept_q), np.concatenate(kept_j), np.concatenate(kept_s), np.concatenate(kept_t)
    order = np.lexsort((-sc[:, 0], pq))  # by query, then S_it descending
    return pq[order], pj[order], sc[order], tm[order], hits


def _max_caption_score(img, txt, owner_idx, gi, pj) -> np.ndarray:
    """max over captions c of row j of img[i] . txt[c], for each pair (i, j), vectorised over pairs."""
    order = np.argsort(owner_idx, kind="stable")  # captions grouped by row
    starts = np.searchsorted(owner_idx[order], np.arange(int(owner_idx.max()) + 2))
    n_caps = starts[pj + 1] - starts[pj]  # (P,) captions of each pair's row
    pair_of = np.repeat(np.arange(len(pj)), n_caps)  # (C,) pair of each expanded caption
    offs = np.arange(len(pair_of)) - np.repeat(np.cumsum(n_caps) - n_caps, n_caps)
    caps = order[starts[pj][pair_of] + offs]  # (C,) caption index
    dots = np.einsum("nd,nd->n", img[gi[pair_of]], txt[caps])  # (C,)
    return np.maximum.reduceat(dots, np.cumsum(n_caps) - n_caps) if len(pj) else np.zeros(0, np.float32)


def dense_reference(img: np.ndarray, txt: np.ndarray, owner: np.ndarray | None = None, thresholds: Thresholds | None = None) -> np.ndarray:
    """M as a dense (N, N) bool matrix, straight from equation 1 (for tests and small data)."""
    th = thresholds or Thresholds()
    img = _normalise(img)
    txt = _normalise(txt)
    n = len(img)
    if owner is None:
        s_it = img @ txt.T
        s_tt = txt @ txt.T
    else:
        owner = np.asarray(owner)
        per_cap = img @ txt.T  # (N, N_txt)
        s_it = np.full((n, n), -np.inf, dtype=np.float32)
        for c, j in enumerate(owner.tolist()):
            s_it[:, j] = np.maximum(s_it[:, j], per_cap[:, c])
        pair = txt @ txt.T  # (N_txt, N_txt)
        s_tt = np.zeros((n, n), dtype=np.float64)
        for a in range(n):
            for b in range(n):
                s_tt[a, b] = pair[np.ix_(owner == a, owner == b)].mean()
    s_ii = img @ img.T
    e = th.enabled
    m = (((s_it > th.p_it) & ("it" in e)) | ((s_ii > th.p_ii) & ("ii" in e))
         | ((s_tt > th.p_tt) & (s_it > th.p_it_tt) & ("tt" in e)))
    np.fill_diagonal(m, False)
    return m


def summarise(mined: Mined, n_rows: int) -> dict:
    """Rows that gained positives, a histogram of positives per row, the share of pairs found by each term."""
    counts = mined.counts
    total = int(counts.sum())
    by_term, only_term = np.zeros(3, np.int64), np.zeros(3, np.int64)  # pairs each term fires for (alone)
    for a in range(0, total, PAIR_SLICE):  # (a slice at a time: the pairs may be memory-mapped)
        t = np.asarray(mined.pair_terms[a : a + PAIR_SLICE])  # (p, 3)
        by_term += t.sum(0)
        only_term += (t & (t.sum(1) == 1)[:, None]).sum(0)
    edges = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, np.inf]
    hist = {}
    for a, b in zip(edges[:-1], edges[1:]):
        label = f"{a}" if b == a + 1 else (f"{a}+" if b == np.inf else f"{a}-{int(b) - 1}")
        hist[label] = int(((counts >= a) & (counts < b)).sum())
    names = ["image-text", "image-image", "text-text and image-text"]
    return {
        "rows": n_rows,
        "rows_with_positives": int((counts > 0).sum()),
        "pairs": total,
        "mean_positives_per_row": round(total / n_rows, 4) if n_rows else 0.0,
        "max_positives_per_row": int(counts.max()) if n_rows else 0,
        "rows_capped": mined.capped_rows,
        "histogram": hist,
        "share_by_term": {k: round(float(by_term[t] / total), 4) if total else 0.0 for t, k in enumerate(names)},
        "share_only_term": {k: round(float(only_term[t] / total), 4) if total else 0.0 for t, k in enumerate(names)},
    }


def calibrate(true_pair_scores: np.ndarray) -> dict:
    """The distribution of S_it over true pairs and the thresholds FFF's recipe gives for this model.

    FFF sets p1 a little below the true pairs' mean (0.27 for a mean of 0.29) and p1' below p1 (0.24):
    vltool keeps those offsets, p1 = mean - 0.02 and p1' = mean - 0.05, and leaves p2, p3 as published.
    """
    s = np.asarray(true_pair_scores, dtype=np.float64)
    q = np.quantile(s, [0.05, 0.25, 0.5, 0.75, 0.95])
    mean = float(s.mean())
    return {
        "true_pairs": int(len(s)),
        "mean": round(mean, 4),
        "std": round(float(s.std()), 4),
        "quantiles": {k: round(float(v), 4) for k, v in zip(["5%", "25%", "50%", "75%", "95%"], q)},
        "suggested": {"p_it": round(mean - 0.02, 4), "p_it_tt": round(mean - 0.05, 4), "p_ii": P_II, "p_tt": P_TT},
    }


# ----------------------------------------------------------------------------------------------------
# The command: encode (through the embedding cache), mine, write `positives`
# ----------------------------------------------------------------------------------------------------

POSITIVE_SCORES = "positive_scores"  # per positive: [S_it, S_ii, S_tt]


@dataclass
class MinePositivesConfig:
    """Options of `vltool mine-positives`, one field per option of the same name (help: `vltool mine-positives --help`)."""

    model: str = ""
    pretrained: str | None = None
    p_it: float = P_IT
    p_ii: float = P_II
    p_tt: float = P_TT
    p_it_tt: float = P_IT_TT
    terms: str = "it,ii,tt"
    calibrated_thresholds: bool = False
    text_column: str = "caption"
    max_positives: int = 256
    index: str = "flat"
    nprobe: int = 32
    recall_sample: int = 2000
    group_column: str | None = None
    calibrate: bool = False
    dry_run: bool = False
    batch_size: int = 64
    decode_threads: int = 1
    cache_dir: str | None = None
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda (vltool.topology.compute_scope)
    threads: int | None = None  # torch's intra-op threads (None: torch's own)

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(self.p_it, self.p_ii, self.p_tt, self.p_it_tt, self.terms)

    def validate(self) -> None:
        problems = []
        if not str(self.model or "").strip():
            problems.append("--model is required (a vltool RUN_DIR, hf:ORG/NAME or hf:DIR, open_clip:ARCH/TAG, open_clip:hf-hub:ORG/NAME, or local-dir:PATH)")
        try:
            self.thresholds.validate()
        except UsageError as e:
            problems.append(str(e))
        if self.max_positives < 1:
            problems.append("--max-positives must be >= 1")
        for name in ("nprobe", "recall_sample", "batch_size", "decode_threads", "threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.index not in INDEXES:
            problems.append(f"--index must be {', '.join(INDEXES)}, got {self.index!r}")
        if problems:
            raise UsageError("; ".join(problems))


def group_agreement(mined: Mined, groups: list, seed: int = 0) -> dict:
    """How mined pairs relate to a known grouping (e.g. emoji `base_id`: skin tones and gender forms).

    precision: share of mined pairs whose two rows share a group; recall: share of all same-group pairs
    (i != j) that were mined; random_pair_rate: the share of same-group pairs among all pairs, which is
    the precision of pairs drawn at random.
    """
    g = np.asarray([str(x) for x in groups])
    _, inv, counts = np.unique(g, return_inverse=True, return_counts=True)
    n = len(g)
    same_total = int((counts * (counts - 1)).sum())
    mined_pairs = len(mined.rows)
    same_mined = 0
    for a in range(0, mined_pairs, PAIR_SLICE):  # (a slice at a time: the pairs may be memory-mapped)
        j = np.asarray(mined.rows[a : a + PAIR_SLICE])  # (p,)
        query = np.searchsorted(mined.offsets, np.arange(a, a + len(j)), side="right") - 1  # (p,) the row of each pair
        same_mined += int((inv[j] == inv[query]).sum())
    return {
        "mined_pairs": mined_pairs,
        "same_group_mined": same_mined,
        "precision": round(same_mined / mined_pairs, 4) if mined_pairs else None,
        "recall": round(same_mined / same_total, 4) if same_total else None,
        "same_group_pairs": same_total,
        "random_pair_rate": round(same_total / (n * (n - 1)), 6) if n > 1 else None,
    }


def threshold_grid(base: Thresholds) -> list[Thresholds]:
    """The grid of `--dry-run`: p1 (and p1' with it) and p2 each moved by -0.02, 0, +0.02 (cf. FFF Table 12)."""
    out = []
    for d1 in (-0.02, 0.0, 0.02):
        for d2 in (-0.02, 0.0, 0.02):
            out.append(Thresholds(round(base.p_it + d1, 4), round(min(1.0, base.p_ii + d2), 4), base.p_tt, round(base.p_it_tt + d1, 4)))
    return out


@computes
def mine_positives(data: str, out, config: MinePositivesConfig, *, where=(), split=None, overwrite: bool = False) -> dict:
    """Encode `data` with the model, mine FFF's positives, write `positives` and `positive_scores` to `out`.
    The mined pairs and the new columns go to files in a spill directory beside `out` (vltool.derived), so
    that memory grows with the embeddings, not with the pairs."""
    timer = provenance.Timer()
    config.validate()
    required = [C.ID] + ([config.group_column] if config.group_column else [])
    src = load_dataset(data, split=split, where=where, required=required, images=[C.IMAGE], texts=[config.text_column], text_lists=True,
                       cache_dir=config.cache_dir)
    require_unique_ids(arrow_column(src.dataset, C.ID), data)  # `positives` names rows by id
    if not config.dry_run and out is None:
        raise UsageError("--out is required (or pass --dry-run)")
    with contextlib.ExitStack() as scope:
        spill = None
        if not config.dry_run:
            scope.enter_context(output_scope())  # out's lock until the end, so no write cleans the spill
            out = check_output(out, overwrite, inputs=[*src.reads, *model_inputs(config.model, config.pretrained)])
            spill = scope.enter_context(spill_beside(out))  # the mined pairs and the new columns, until out is written
        return _mine_and_write(src, out, config, spill, data=data, overwrite=overwrite, timer=timer)


@dataclass
class MiningRows:
    """The rows mined (a decodable image and at least one text) with their L2-normalised embeddings, and the
    statistics of the encoding."""

    rows: np.ndarray  # (G,) dataset row of each mined row
    i_emb: np.ndarray  # (G, D) each mined row's image
    t_emb: np.ndarray  # (T, D) each text of the mined rows
    t_owner: np.ndarray  # (T,) mined row of each text
    multi: bool  # several captions a row
    stats: dict

    @property
    def owner(self) -> np.ndarray | None:
        """Each text's row, as mine() takes it: None when every row has one text."""
        return self.t_owner if self.multi else None


def _mine_and_write(src, out, config: MinePositivesConfig, spill, *, data: str, overwrite: bool, timer) -> dict:
    """Encode, mine, write: the dry run's grid record instead of the mining with --dry-run."""
    n = len(src.dataset)
    if n < 2:
        raise UsageError(f"mining needs at least 2 rows; {data!r} has {n} after the row filter")
    m = load_eval_model(config.model, config.pretrained, config.cache_dir)
    mr = encode_mining_rows(m, src, config, data)
    calib = calibrate(true_pair_scores(mr))
    mr.stats["calibration"] = calib
    groups = _row_groups(src.dataset, config, mr.rows)
    if config.dry_run:
        return dry_run_record(m, src, config, mr, groups, timer)
    if config.calibrated_thresholds:  # FFF's recipe on this model: p1 = mean - 0.02, p1' = mean - 0.05
        config = dataclasses.replace(config, p_it=calib["suggested"]["p_it"], p_it_tt=calib["suggested"]["p_it_tt"])
    mined = mine_rows(mr, config, groups, spill)
    return write_positives(src, out, config, m, mr, mined, spill, overwrite=overwrite, timer=timer)


def encode_mining_rows(m, src, config: MinePositivesConfig, data: str) -> MiningRows:
    """Every row's image and text(s) encoded (through the cache); the usable rows' embeddings kept, normalised."""
    import datasets

    ds = src.dataset
    n = len(ds)
    cache = EmbeddingCache(config.cache_dir)
    img = encode_images(m, src, cache=cache, batch_size=config.batch_size, workers=config.decode_threads)
    txt = encode_texts(m, src, column=config.text_column, cache=cache)
    multi = not isinstance(ds.features[config.text_column], datasets.Value)
    good = usable_rows(img.bad, txt.owner, n, config.text_column, data)  # (n,)
    rows = np.flatnonzero(good)  # (G,) dataset row of each mined row
    remap = -np.ones(n, dtype=np.int64)
    remap[rows] = np.arange(len(rows))
    keep_txt = good[txt.owner]
    t_owner = remap[txt.owner[keep_txt]]
    # the mined rows' embeddings, L2-normalised in place once (the same numbers _normalise gives): the encoded
    # arrays themselves when every row is mined (this command's own: the cache hands out a copy), else copies
    t_emb = _mined_rows(txt.embeddings, keep_txt)  # (T, D)
    i_emb = _mined_rows(img.embeddings, good)  # (G, D)
    for x in (t_emb, i_emb):
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    stats: dict = {"rows": n, "rows_mined": int(len(rows)), "rows_skipped": int(n - len(rows)),
                   "text_column": config.text_column, "several_captions": multi,
                   "encoding": {"images": img.summary(), "texts": txt.summary()}}
    return MiningRows(rows, i_emb, t_emb, t_owner, multi, stats)


def usable_rows(bad: np.ndarray, owner: np.ndarray, n: int, text_column: str, data: str) -> np.ndarray:
    """(n,) rows usable for mining: a decodable image and at least one text. The others are left out with a
    warning; fewer than 2 usable rows is an error."""
    has_text = np.zeros(n, dtype=bool)
    has_text[owner] = True
    require_decoded(bad, data)
    if bad.any():
        warn(f"{int(bad.sum())} images could not be decoded; they are left out")
    no_text = missing_text_warning(int((~has_text).sum()), n, text_column)
    if no_text:
        warn(no_text)
    good = ~bad & has_text
    if good.sum() < 2:
        raise VltoolError(f"mining needs at least 2 rows with a decodable image and text; {int(good.sum())} of {n} have both")
    return good


def true_pair_scores(mr: MiningRows) -> np.ndarray:
    """(G,) each row's image with its own text(s): the best one, as S_it is defined."""
    s_true = np.full(len(mr.rows), -np.inf, dtype=np.float32)
    for a in range(0, len(mr.t_emb), 1 << 16):  # (slices: no copy of every text's image)
        own = mr.t_owner[a : a + (1 << 16)]
        np.maximum.at(s_true, own, np.einsum("nd,nd->n", mr.i_emb[own], mr.t_emb[a : a + (1 << 16)]))
    return s_true


def _row_groups(ds, config: MinePositivesConfig, rows: np.ndarray) -> list | None:
    """The --group-column value of each mined row (None without the option)."""
    if not config.group_column:
        return None
    group_values = column_values(ds, config.group_column)
    return [group_values[int(r)] for r in rows]


def dry_run_record(m, src, config: MinePositivesConfig, mr: MiningRows, groups: list | None, timer) -> dict:
    """--dry-run: what the 9 points of threshold_grid would mine (one search for all of them), nothing written."""
    grid = []
    points = threshold_grid(config.thresholds)
    each = mine_grid(mr.i_emb, mr.t_emb, mr.owner, points, max_positives=config.max_positives, index=config.index, nprobe=config.nprobe,
                     normalised=True)
    for th, mined in zip(points, each):
        row = {"thresholds": vars(th), **{k: v for k, v in summarise(mined, len(mr.rows)).items() if k != "histogram"}}
        if groups is not None:
            row["groups"] = group_agreement(mined, groups)
        grid.append(row)
    mr.stats["grid"] = grid
    return provenance.make("mine-positives", config, [src], rows_in=len(src.dataset), rows_out=None, stats=mr.stats, timer=timer) | {
        "model": model_record(m, config.model, config.pretrained)}


def mine_rows(mr: MiningRows, config: MinePositivesConfig, groups: list | None, spill) -> Mined:
    """The positives at config's thresholds, their summary (and the group agreement, IVF's recall) in mr.stats."""
    mr.stats["thresholds"] = vars(config.thresholds)
    mined = mine(mr.i_emb, mr.t_emb, mr.owner, config.thresholds, max_positives=config.max_positives,
                 index=config.index, nprobe=config.nprobe, progress=True, normalised=True, spill=spill)
    mr.stats.update(summarise(mined, len(mr.rows)))
    if groups is not None:
        mr.stats["groups"] = {"column": config.group_column, **group_agreement(mined, groups)}
    if config.index == "ivf":
        mr.stats["ivf_recall"] = _ivf_recall(mr.i_emb, mr.t_emb, mr.owner, config, mined)
    return mined


def write_positives(src, out, config: MinePositivesConfig, m, mr: MiningRows, mined: Mined, spill, *, overwrite: bool, timer) -> dict:
    """`positives` and `positive_scores` beside the input's columns, written to `out` with the provenance record."""
    import datasets

    ds = src.dataset
    n = len(ds)
    new = positive_columns(mined, mr.rows, n, arrow_column(ds, C.ID), spill=spill)
    # the input's table with the new columns beside it (a second mining replaces the first's): add_column on
    # a --where selection would write every selected row anew, images included (vltool.derived)
    features = {C.POSITIVES: datasets.Sequence(datasets.Value("string")),
                POSITIVE_SCORES: datasets.Sequence(datasets.Sequence(datasets.Value("float32"), length=3))}
    ds = add_columns(ds, new, key=_mined_key(mr.rows, mined), features=features)
    prov = provenance.make("mine-positives", config, [src], rows_in=n, rows_out=n, stats=mr.stats, timer=timer)
    prov["model"] = model_record(m, config.model, config.pretrained)
    save_dataset(ds, out, prov, overwrite=overwrite)
    return prov


def _mined_key(rows: np.ndarray, mined: Mined) -> bytes:
    """A digest of what the new columns are made from (for the output's fingerprint), read a slice at a time."""
    h = hashlib.blake2b(digest_size=16)
    for x in (rows, mined.offsets, mined.rows, mined.pair_scores):
        for a in range(0, len(x), PAIR_SLICE):
            h.update(np.ascontiguousarray(x[a : a + PAIR_SLICE]).tobytes())
    return h.digest()


def _mined_rows(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """x[keep] as a C-contiguous, writable float32 array: x itself when it already is one and keeps every row."""
    if keep.all() and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable:
        return x
    return np.ascontiguousarray(x[keep], dtype=np.float32)


PAIR_SLICE = 1 << 20  # pairs handled at once where a pass goes over every mined pair
ROW_SLICE = 1 << 20  # and rows


def positive_columns(mined: Mined, rows: np.ndarray, n: int, ids, spill=None):
    """The `positives` (ids) and `positive_scores` ([S_it, S_ii, S_tt], rounded to 5 decimals) columns of the
    n dataset rows, as a `datasets` table, built as Arrow arrays (no Python object per pair: a list of
    strings and a list of float lists per row cost ~150 bytes a pair) `PAIR_SLICE` pairs' worth of rows at
    a time, into a file in `spill` when given (vltool.derived.ColumnSpill) so that memory does not grow
    with the pairs. mined.positives[k] holds indices into `rows` of the positives of dataset row rows[k];
    rows not mined get empty lists. ids: the id column."""
    import pyarrow as pa

    rows = np.asarray(rows, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    counts[rows] = mined.counts
    order = np.argsort(rows, kind="stable")  # mined rows in dataset order
    sorted_rows = rows[order]
    ids = pa.chunked_array(ids).combine_chunks() if isinstance(ids, pa.ChunkedArray) else pa.array(ids)
    schema = pa.schema([(C.POSITIVES, pa.list_(pa.string())), (POSITIVE_SCORES, pa.list_(pa.list_(pa.float32(), 3)))])
    out = ColumnSpill(spill and Path(spill) / "positives.arrow", schema)
    ends = np.cumsum(counts)  # (n,) pairs up to and including each dataset row
    # slices of rows [a, b) with about PAIR_SLICE pairs (a row has at most max_positives) and at most ROW_SLICE rows
    edges = np.unique(np.concatenate([[0, n], np.arange(0, n, ROW_SLICE),
                                      np.searchsorted(ends, np.arange(PAIR_SLICE, int(ends[-1]) if n else 0, PAIR_SLICE))]))
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        lo, hi = np.searchsorted(sorted_rows, [a, b])
        ks = order[lo:hi]  # (g,) the mined rows among them, in dataset order
        starts, lens = mined.offsets[ks], mined.counts[ks]
        gather = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(lens.sum())  # (p,) pair at each place
        flat_j = np.asarray(mined.rows[gather], dtype=np.int64)  # (p,) (a read of the memory-mapped pairs)
        flat_s = np.round(np.asarray(mined.pair_scores[gather], dtype=np.float32), 5)  # (p, 3)
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts[a:b])]), type=pa.int32())
        names = ids.take(pa.array(rows[flat_j], type=pa.int64())).cast(pa.string())
        triples = pa.FixedSizeListArray.from_arrays(pa.array(flat_s.ravel(), type=pa.float32()), 3)
        out.add([pa.ListArray.from_arrays(offsets, names), pa.ListArray.from_arrays(offsets, triples)])
    return out.table()


def _ivf_recall(i_emb, t_emb, owner, config: MinePositivesConfig, approx: Mined) -> dict:
    """Recall of the IVF result against exact search, on a seeded sample of rows."""
    rng = np.random.default_rng(config.seed)
    sample = np.sort(rng.choice(len(i_emb), size=min(config.recall_sample, len(i_emb)), replace=False))
    exact = mine(i_emb, t_emb, owner, config.thresholds, max_positives=config.max_positives, index="flat", query_rows=sample,
                 normalised=True)
    e = len(exact.rows)
    hit = sum(len(np.intersect1d(exact.row(k), approx.row(i))) for k, i in enumerate(sample.tolist()))
    return {"sample_rows": int(len(sample)), "exact_pairs": int(e), "recall": round(hit / e, 4) if e else None}
