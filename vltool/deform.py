"""`vltool deform`: captions to bags of words ("A Fistful of Words", section 2.2, Figure 2).

Operations (docs/deform.md):
- `shuffle`      Shuffle: random order of the tokens.
- `rmstop`       RmStopNalpha: drop NLTK's English stop words and every token that is not purely alphabetic.
- `basevocab`    LimitToBaseVocab: keep only tokens that occur in the base captions.
- `rmtopfreqT`   RmTopFreq(t): drop the t words that occur in the most base captions.
- `keepN`        Keep(n): keep the first n tokens; always applied last.

Every operation but Keep is an independent filter, so their order does not matter (section 2.2). vltool
applies the filters, then the shuffle, then Keep, whatever order --ops lists them in: shuffling the
survivors is the same distribution as filtering a shuffled list, and the output then depends only on
the set of operations. A seeded `base_frac` of the rows is the base set: intact, and the only rows the
vocabulary and word frequencies are counted on.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from vltool import columns as C
from vltool.errors import UsageError
from vltool.text import english_stopwords, tokenize

DEFAULT_OPS = "shuffle,rmstop,basevocab,rmtopfreq1000,keep4"
_MASK = (1 << 64) - 1
_OP_RE = re.compile(r"^(shuffle|rmstop|basevocab|rmtopfreq(\d+)|keep(\d+))$")


@dataclass(frozen=True)
class Ops:
    """A parsed --ops list."""

    shuffle: bool = False
    rmstop: bool = False
    basevocab: bool = False
    rmtopfreq: int | None = None  # t of RmTopFreq(t)
    keep: int | None = None  # n of Keep(n)

    @classmethod
    def parse(cls, text: str) -> "Ops":
        text = text.strip().lower()
        if text == "default":
            text = DEFAULT_OPS
        names = [t.strip() for t in text.split(",") if t.strip()]
        if not names:
            raise UsageError("--ops is empty; e.g. --ops shuffle,rmstop,keep4 or --ops default")
        kw: dict = {}
        for name in names:
            m = _OP_RE.match(name)
            if not m:
                raise UsageError(
                    f"--ops: unknown operation {name!r}; use shuffle, rmstop, basevocab, rmtopfreqT (e.g. rmtopfreq1000), "
                    "keepN (e.g. keep4), or default"
                )
            key = "rmtopfreq" if name.startswith("rmtopfreq") else "keep" if name.startswith("keep") else name
            if key in kw:
                raise UsageError(f"--ops: {key} is given twice")
            if key == "rmtopfreq":
                kw[key] = int(m.group(2))
                if kw[key] < 1:
                    raise UsageError("--ops: rmtopfreqT needs T >= 1")
            elif key == "keep":
                kw[key] = int(m.group(3))
                if kw[key] < 1:
                    raise UsageError("--ops: keepN needs N >= 1")
            else:
                kw[key] = True
        return cls(**kw)

    @property
    def needs_base(self) -> bool:
        return self.basevocab or self.rmtopfreq is not None

    def __str__(self) -> str:
        parts = [p for p, on in (("shuffle", self.shuffle), ("rmstop", self.rmstop), ("basevocab", self.basevocab)) if on]
        if self.rmtopfreq is not None:
            parts.append(f"rmtopfreq{self.rmtopfreq}")
        if self.keep is not None:
            parts.append(f"keep{self.keep}")
        return ",".join(parts)


@dataclass
class DeformConfig:
    """Options of `vltool deform`."""

    ops: str = "default"  # comma-separated operations, or "default" (the paper's cascade)
    base_frac: float = 0.1  # fraction of rows kept intact as the base set; 0 deforms every row ("only BoW")
    column: str = C.CAPTION  # the text column to deform
    seed: int = 0  # base-set choice and per-row shuffles (each row's seed comes from this and its id)
    num_proc: int = 1  # worker processes; the output does not depend on it

    def validate(self) -> Ops:
        problems = []
        try:
            ops = Ops.parse(self.ops)
        except UsageError as e:
            problems.append(str(e))
            ops = None
        if not 0.0 <= self.base_frac < 1.0:
            problems.append(f"--base-frac must be in [0, 1), got {self.base_frac}")
        elif ops is not None and ops.needs_base and self.base_frac == 0:
            problems.append(
                "basevocab and rmtopfreq count words on the base captions, and --base-frac 0 leaves none; "
                "drop them from --ops or give --base-frac > 0"
            )
        if self.num_proc < 1:
            problems.append("--num-proc must be >= 1")
        if problems:
            raise UsageError("; ".join(problems))
        return ops


@dataclass
class Vocabulary:
    """What deform fits on the base captions, and the stop words it uses."""

    stopwords: frozenset[str]
    base_vocab: frozenset[str] | None = None  # every token of the base captions
    top_words: list[str] = field(default_factory=list)  # the RmTopFreq(t) words, most frequent first
    top_counts: list[int] = field(default_factory=list)


def fit_vocabulary(base_captions: Sequence[str], ops: Ops, stopwords: frozenset[str]) -> Vocabulary:
    """Base vocabulary and the t most frequent base words.

    A word's frequency is the number of base captions containing it, over every alphabetic token
    (stop words included). Ties at the t-th place are broken alphabetically.
    """
    vocab: set[str] = set()
    df: Counter = Counter()
    for text in base_captions:
        toks = set(tokenize(text or ""))
        vocab |= toks
        df.update(t for t in toks if t.isalpha())
    top = sorted(df.items(), key=lambda kv: (-kv[1], kv[0]))[: ops.rmtopfreq or 0]
    return Vocabulary(
        stopwords=stopwords,
        base_vocab=frozenset(vocab) if ops.basevocab else None,
        top_words=[w for w, _ in top],
        top_counts=[c for _, c in top],
    )


def row_seed(seed: int, row_id: str) -> int:
    """A 64-bit seed for one row, from the run's seed and the row's id (so any --num-proc gives the same rows)."""
    return int.from_bytes(hashlib.blake2b(f"{seed}\x00{row_id}".encode(), digest_size=8).digest(), "little")


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    """The same hash on a uint64 array (wrap-around arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _keep_predicate(ops: Ops, vocab: Vocabulary):
    """One test per token that applies every filter at once."""
    top = frozenset(vocab.top_words)
    if ops.basevocab:
        allowed = {
            t for t in vocab.base_vocab if t not in top and (not ops.rmstop or (t.isalpha() and t not in vocab.stopwords))
        }
        return allowed.__contains__
    if ops.rmstop:
        drop = vocab.stopwords | top
        return lambda t: t.isalpha() and t not in drop
    if top:
        return lambda t: t not in top
    return None


def deform_caption(text: str, ops: Ops, vocab: Vocabulary, seed: int) -> tuple[str, list[str]]:
    """Reference implementation, one caption at a time: (deformed text, removed tokens).

    `seed` is the row's seed (`row_seed`). Token j of the filtered list gets the key
    splitmix64(seed + j); the shuffle orders tokens by key.
    """
    toks = tokenize(text or "")
    kept, removed = [], []
    for t in toks:
        ok = True
        if ops.rmstop and (not t.isalpha() or t in vocab.stopwords):
            ok = False
        if ops.basevocab and t not in vocab.base_vocab:
            ok = False
        if ops.rmtopfreq is not None and t in vocab.top_words:
            ok = False
        (kept if ok else removed).append(t)
    if ops.shuffle:
        keys = [_splitmix64((seed + j) & _MASK) for j in range(len(kept))]
        kept = [kept[j] for j in sorted(range(len(kept)), key=keys.__getitem__)]
    if ops.keep is not None:
        removed += kept[ops.keep :]
        kept = kept[: ops.keep]
    return " ".join(kept), removed


def deform_batch(
    texts: Sequence[str], seeds: Sequence[int], ops: Ops, vocab: Vocabulary
) -> tuple[list[str], Counter]:
    """Fast implementation of `deform_caption` over many captions: same outputs, shuffles vectorised."""
    keep_token = _keep_predicate(ops, vocab)
    kept_lists: list[list[str]] = []
    removed: list[str] = []
    for text in texts:
        toks = tokenize(text or "")
        if keep_token is not None:
            kept = [t for t in toks if keep_token(t)]
            if len(kept) != len(toks):
                removed.extend(t for t in toks if not keep_token(t))
        else:
            kept = toks
        kept_lists.append(kept)
    lens = np.fromiter((len(k) for k in kept_lists), dtype=np.int64, count=len(kept_lists))
    flat = [t for k in kept_lists for t in k]
    if ops.shuffle and flat:
        rows = np.repeat(np.arange(len(kept_lists)), lens)  # (T,) row of each token
        starts = np.cumsum(lens) - lens
        pos = np.arange(len(flat), dtype=np.int64) - np.repeat(starts, lens)  # (T,) position within its row
        row_seeds = np.array([int(s) for s in seeds], dtype=np.uint64)
        with np.errstate(over="ignore"):
            keys = _splitmix64_np(row_seeds[rows] + pos.astype(np.uint64))  # (T,)
        order = np.lexsort((keys, rows))  # by row, then key; stable like sorted()
        flat = [flat[i] for i in order.tolist()]
    out = []
    start = 0
    n_keep = ops.keep
    for n in lens.tolist():
        end = start + n
        if n_keep is not None and n > n_keep:
            removed.extend(flat[start + n_keep : end])
            out.append(" ".join(flat[start : start + n_keep]))
        else:
            out.append(" ".join(flat[start:end]))
        start = end
    return out, Counter(removed)


def choose_base(n: int, base_frac: float, seed: int) -> np.ndarray:
    """(n,) bool: a seeded random round(base_frac * n) rows form the base set."""
    mask = np.zeros(n, dtype=bool)
    k = int(round(base_frac * n))
    if k:
        mask[np.random.default_rng(seed).choice(n, size=k, replace=False)] = True
    return mask


# Worker state for fork-based multiprocessing: set before the pool starts, inherited by the workers.
_WORK: dict = {}
MIN_ROWS_PER_PROC = 20_000  # below this, one process is faster than starting a pool


def _work(span: tuple[int, int]) -> tuple[list[str], Counter]:
    lo, hi = span
    w = _WORK
    seeds = [row_seed(w["seed"], i) for i in w["ids"][lo:hi]] if w["ops"].shuffle else [0] * (hi - lo)
    return deform_batch(w["texts"][lo:hi], seeds, w["ops"], w["vocab"])


def deform_texts(
    texts: list[str], ids: list[str], is_base: np.ndarray, ops: Ops, vocab: Vocabulary, seed: int, num_proc: int = 1
) -> tuple[list[str], Counter]:
    """Deform the non-base rows of `texts` (base rows are returned unchanged)."""
    idx = np.flatnonzero(~is_base)
    sub_texts = [texts[i] for i in idx.tolist()]
    sub_ids = [ids[i] for i in idx.tolist()]
    _WORK.update(texts=sub_texts, ids=sub_ids, ops=ops, vocab=vocab, seed=seed)
    try:
        n = len(sub_texts)
        if num_proc <= 1 or n < MIN_ROWS_PER_PROC * 2:
            outs, removed = _work((0, n))
        else:
            import multiprocessing as mp

            chunk = max(MIN_ROWS_PER_PROC // 2, -(-n // (num_proc * 4)))
            spans = [(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]
            outs, removed = [], Counter()
            with mp.get_context("fork").Pool(num_proc) as pool:
                for o, r in pool.imap(_work, spans):
                    outs.extend(o)
                    removed.update(r)
    finally:
        _WORK.clear()
    result = list(texts)
    for j, i in enumerate(idx.tolist()):
        result[i] = outs[j]
    return result, removed


def column_values(ds, name: str) -> list:
    """A column as a Python list, honouring a selection (indices mapping) without copying other columns."""
    arr = ds.data.column(name)
    if ds._indices is not None:
        arr = arr.take(ds._indices.column(0))
    return arr.to_pylist()


def _words(text: str | None) -> int:
    return len(text.split()) if text else 0


def deform_dataset(ds, config: DeformConfig) -> tuple[object, dict]:
    """Deform `ds[config.column]`; return the new dataset (empty rows dropped) and its statistics."""
    import datasets

    ops = config.validate()
    from vltool.io import require_columns

    require_columns(ds, [C.ID, config.column], "the input")
    feature = ds.features[config.column]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        raise UsageError(f"--column {config.column!r} is not a text column (its type is {feature})")
    texts = column_values(ds, config.column)
    ids = column_values(ds, C.ID)
    n = len(texts)
    stopwords, stop_source = english_stopwords()
    is_base = choose_base(n, config.base_frac, config.seed)
    vocab = fit_vocabulary([texts[i] for i in np.flatnonzero(is_base).tolist()], ops, stopwords)
    new_texts, removed = deform_texts(texts, ids, is_base, ops, vocab, config.seed, config.num_proc)

    keep = np.array([bool(t) or b for t, b in zip(new_texts, is_base.tolist())], dtype=bool)
    original_col = C.CAPTION_ORIGINAL if config.column == C.CAPTION else f"{config.column}_original"
    order = list(ds.column_names)
    if ds._indices is not None:
        ds = ds.flatten_indices()
    ds = ds.remove_columns([config.column]).add_column(config.column, new_texts, feature=feature)
    if original_col not in order:  # a second deform keeps the intact text of the first
        ds = ds.add_column(original_col, texts, feature=feature)
        order.append(original_col)
    if C.IS_BASE in order:
        ds = ds.remove_columns([C.IS_BASE])
    else:
        order.append(C.IS_BASE)
    ds = ds.add_column(C.IS_BASE, is_base.tolist(), feature=datasets.Value("bool"))
    ds = ds.select_columns(order)
    if not keep.all():
        ds = ds.select(np.flatnonzero(keep))

    kept_texts = [t for t, k in zip(new_texts, keep.tolist()) if k]
    rows_out = len(kept_texts)
    top_removed = [
        [w, c] for w, c in sorted(removed.items(), key=lambda kv: (-kv[1], kv[0])) if w.isalpha() and w not in stopwords
    ][:20]
    stats = {
        "ops": str(ops),
        "rows_in": n,
        "rows_out": rows_out,
        "rows_dropped_empty": n - rows_out,
        "base_rows": int(is_base.sum()),
        "deformed_rows": int(n - is_base.sum()),
        "avg_caption_len_before": round(sum(map(_words, texts)) / n, 3) if n else 0.0,
        "avg_caption_len_after": round(sum(map(_words, kept_texts)) / rows_out, 3) if rows_out else 0.0,
        "dataset_size_change_pct": round(100.0 * (rows_out - n) / n, 2) if n else 0.0,
        "base_vocab_size": len(vocab.base_vocab) if vocab.base_vocab is not None else None,
        "rmtopfreq_words": [[w, c] for w, c in zip(vocab.top_words[:20], vocab.top_counts[:20])],
        "top_removed_words": top_removed,
        "stopwords": stop_source,
    }
    return ds, stats


def deform(
    data: str,
    out,
    config: DeformConfig,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Load `data`, deform it, write it atomically to `out` with its `vltool.json`; return that record."""
    from vltool import provenance
    from vltool.io import check_output, load_dataset, save_dataset

    timer = provenance.Timer()
    config.validate()
    src = load_dataset(data, split=split, where=where, required=[C.ID, config.column])
    out = check_output(out, overwrite, inputs=[src.path])
    ds, stats = deform_dataset(src.dataset, config)
    prov = provenance.make(
        "deform", config, [src], rows_in=stats["rows_in"], rows_out=stats["rows_out"], stats=stats, timer=timer
    )
    save_dataset(ds, out, prov, overwrite=overwrite, num_proc=config.num_proc)
    prov["wall_time_s"] = round(timer.seconds, 3)
    return prov
