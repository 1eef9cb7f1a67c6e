"""`vltool deform`: captions to bags of words ("A Fistful of Words", section 2.2, Figure 2).

Each operation is declared once, in `OPS`: its `--ops` word and parameter, its help line, its reference
form (one caption at a time) and its fast form (many captions). The parser, the recorded spelling
(`str(Ops)`), the errors, `vltool deform --help` and docs/deform.md's table come from there.

Every operation but Keep is an independent filter, so their order does not matter (section 2.2). vltool
applies the filters, then the shuffle, then Keep, whatever order --ops lists them in: shuffling the
survivors is the same distribution as filtering a shuffled list, and the output then depends only on
the set of operations. A seeded `base_frac` of the rows is the base set: intact, and the only rows the
vocabulary and word frequencies are counted on.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from vltool import columns as C
from vltool.checks import has_text
from vltool.console import Bar
from vltool.derived import ColumnSpill, replace_text_column, spill_beside
from vltool.errors import UsageError
from vltool.io.digests import arrow_column
from vltool.io.loading import require_columns
from vltool.text import StopWords, english_stopwords, tokenize

DEFAULT_OPS = "shuffle,rmstop,basevocab,rmtopfreq1000,keep4"
_MASK = (1 << 64) - 1


@dataclass
class Vocabulary:
    """What deform fits on the base captions, and the stop words it uses."""

    stopwords: frozenset[str]
    base_vocab: frozenset[str] | None = None  # every token of the base captions
    top_words: list[str] = field(default_factory=list)  # the RmTopFreq(t) words, most frequent first
    top_counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.top_set = frozenset(self.top_words)


# ----------------------------------------------------------------------------------------------------
# The operations, declared once
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One `--ops` operation: the word (with `param`, an integer >= `minimum` follows it: rmtopfreq1000),
    the paper's name, one help line, and whether it counts words on the base captions."""

    name: str
    paper: str
    help: str
    param: str | None = None  # the parameter's letter in help and errors ("T" of rmtopfreqT); None: a plain word
    example: int | None = None  # a value of the parameter shown in help and errors (rmtopfreq1000)
    minimum: int = 1
    needs_base: bool = False

    def __post_init__(self) -> None:
        if not (self.name and self.paper and self.help):
            raise ValueError(f"deform op {self.name!r} (vltool/deform.py OPS) needs a name, a paper name and a help line")
        if (self.param is None) != (self.example is None) or (self.example is not None and self.example < self.minimum):
            raise ValueError(f"deform op {self.name!r} (vltool/deform.py OPS): a parameter needs an example >= its minimum, "
                             "and a plain word neither")

    def usage(self) -> str:
        """How help and errors write it: `keepN`, `shuffle`."""
        return self.name + (self.param or "")

    def spell(self, value: int | None) -> str:
        """The canonical word for `value` (what `str(Ops)` records, and what parses back to it)."""
        return self.name if self.param is None else f"{self.name}{value}"

    def match(self, word: str) -> re.Match | None:
        return re.match(rf"^{re.escape(self.name)}(\d+)$" if self.param else rf"^{re.escape(self.name)}$", word)


@dataclass(frozen=True)
class Parts:
    """A filter's fast form, as sets and a test, so that every filter of a run folds into one token test:
    a token survives when it is in `allow` (None: any), not in `drop`, and passes `test` (None: any)."""

    allow: frozenset[str] | None = None
    drop: frozenset[str] = frozenset()
    test: Callable[[str], bool] | None = None


@dataclass(frozen=True, kw_only=True)
class FilterOp(Op):
    """A filter: drops tokens, independently of the other filters and of the tokens' order.
    `reference(token, vocab)`: does the token survive; `fast(vocab)`: the same as `Parts`."""

    reference: Callable[[str, Vocabulary], bool]
    fast: Callable[[Vocabulary], Parts]


@dataclass(frozen=True, kw_only=True)
class OrderOp(Op):
    """Reorders a caption's surviving tokens, after the filters. `reference(tokens, row_seed)`: one caption;
    `fast(flat, lens, ids, seed)`: the tokens of many captions, row after row (`lens` each row's count)."""

    reference: Callable[[list[str], int], list[str]]
    fast: Callable[[list[str], np.ndarray, Sequence[str], int], list[str]]


@dataclass(frozen=True, kw_only=True)
class CutOp(Op):
    """Keeps a prefix of a caption's tokens, last of all. `reference(tokens, value)`: the kept tokens;
    `fast(n_tokens, value)`: how many of the first tokens are kept."""

    reference: Callable[[list[str], int], list[str]]
    fast: Callable[[int, int], int]


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


def row_seed(seed: int, row_id: str) -> int:
    """A 64-bit seed for one row, from the run's seed and the row's id (so any --num-proc gives the same rows)."""
    return int.from_bytes(hashlib.blake2b(f"{seed}\x00{row_id}".encode(), digest_size=8).digest(), "little")


def _shuffle(tokens: list[str], seed: int) -> list[str]:
    """Token j gets the key splitmix64(seed + j), `seed` the row's (`row_seed`); tokens are ordered by key."""
    keys = [_splitmix64((seed + j) & _MASK) for j in range(len(tokens))]
    return [tokens[j] for j in sorted(range(len(tokens)), key=keys.__getitem__)]


def _shuffle_rows(flat: list[str], lens: np.ndarray, ids: Sequence[str], seed: int) -> list[str]:
    """`_shuffle` of every row at once, vectorised; row seeds only for rows with two or more tokens."""
    if not flat:
        return flat
    rows = np.repeat(np.arange(len(lens)), lens)  # (T,) row of each token
    starts = np.cumsum(lens) - lens
    pos = np.arange(len(flat), dtype=np.int64) - np.repeat(starts, lens)  # (T,) position within its row
    row_seeds = np.array([row_seed(seed, i) if n > 1 else 0 for i, n in zip(ids, lens.tolist())], dtype=np.uint64)  # (rows,)
    with np.errstate(over="ignore"):
        keys = _splitmix64_np(row_seeds[rows] + pos.astype(np.uint64))  # (T,)
    order = np.lexsort((keys, rows))  # by row, then key; stable like sorted()
    return [flat[i] for i in order.tolist()]


# The order here is the order `str(Ops)` records them in.
OPS: tuple[Op, ...] = (
    OrderOp("shuffle", "Shuffle", "random order of the tokens (seeded per row)",
            reference=_shuffle, fast=_shuffle_rows),
    FilterOp("rmstop", "RmStopNalpha", "drops NLTK's English stop words and every token not purely alphabetic (str.isalpha)",
             reference=lambda t, v: t.isalpha() and t not in v.stopwords,
             fast=lambda v: Parts(drop=v.stopwords, test=str.isalpha)),
    FilterOp("basevocab", "LimitToBaseVocab", "keeps only tokens that occur in the base captions", needs_base=True,
             reference=lambda t, v: t in v.base_vocab,
             fast=lambda v: Parts(allow=v.base_vocab)),
    FilterOp("rmtopfreq", "RmTopFreq(t)", "drops the t words that occur in the most base captions",
             param="T", example=1000, needs_base=True,
             reference=lambda t, v: t not in v.top_set,
             fast=lambda v: Parts(drop=v.top_set)),
    CutOp("keep", "Keep(n)", "keeps the first n tokens; always last", param="N", example=4,
          reference=lambda toks, n: toks[:n],
          fast=lambda length, n: min(length, n)),
)
OP = {op.name: op for op in OPS}


def base_ops() -> str:
    """The operations that count words on the base captions, in words: "basevocab and rmtopfreq"."""
    words = [op.name for op in OPS if op.needs_base]
    return " and ".join([", ".join(words[:-1]), words[-1]]) if len(words) > 1 else "".join(words)


def ops_usage() -> str:
    """The words --ops takes, as errors list them."""
    return ", ".join(op.usage() + (f" (e.g. {op.spell(op.example)})" if op.param else "") for op in OPS) + ", or default"


def ops_help() -> str:
    """The operations, one indented line each, for `vltool deform --help`."""
    width = max(len(op.usage()) for op in OPS) + 2
    lines = [f"  {op.usage():<{width}}{op.paper}: {op.help}" for op in OPS]
    return "\n".join([*lines, f"  {'default':<{width}}the paper's cascade: {DEFAULT_OPS}"])


def ops_markdown() -> str:
    """docs/deform.md's table of the operations (tests/test_deform.py holds the page to it)."""
    rows = [f"| `{op.usage()}` | {op.paper} | {op.help} |" for op in OPS]
    return "\n".join(["| `--ops` | paper | what it does |", "|---|---|---|", *rows,
                      f"| `default` | the default cascade | `{DEFAULT_OPS}` |"]) + "\n"


@dataclass(frozen=True)
class Ops:
    """A parsed --ops list: the chosen operations' names and parameters (None for a plain word), in OPS's order."""

    chosen: tuple[tuple[str, int | None], ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Ops":
        text = text.strip().lower()
        if text == "default":
            text = DEFAULT_OPS
        words = [t.strip() for t in text.split(",") if t.strip()]
        if not words:
            raise UsageError("--ops is empty; e.g. --ops shuffle,rmstop,keep4 or --ops default")
        given: dict[str, int | None] = {}
        for word in words:
            found = [(op, m) for op in OPS if (m := op.match(word))]
            if not found:
                raise UsageError(f"--ops: unknown operation {word!r}; use {ops_usage()}")
            op, m = found[0]
            if op.name in given:
                raise UsageError(f"--ops: {op.name} is given twice")
            given[op.name] = int(m.group(1)) if op.param else None
            if op.param and given[op.name] < op.minimum:
                raise UsageError(f"--ops: {op.usage()} needs {op.param} >= {op.minimum}")
        return cls(tuple((op.name, given[op.name]) for op in OPS if op.name in given))

    def __contains__(self, name: str) -> bool:
        return any(n == name for n, _ in self.chosen)

    def param(self, name: str) -> int | None:
        """The parameter of operation `name` (None when it is not chosen)."""
        return dict(self.chosen).get(name)

    def of(self, kind: type) -> list[tuple[Any, int | None]]:
        """The chosen operations of one kind (FilterOp, OrderOp, CutOp) with their parameters, in OPS's order."""
        return [(OP[n], v) for n, v in self.chosen if isinstance(OP[n], kind)]

    @property
    def needs_base(self) -> bool:
        return any(OP[n].needs_base for n, _ in self.chosen)

    def __str__(self) -> str:
        return ",".join(OP[n].spell(v) for n, v in self.chosen)


@dataclass
class DeformConfig:
    """Options of `vltool deform`, one field per option of the same name (help: `vltool deform --help`)."""

    ops: str = "default"
    base_frac: float = 0.1
    text_column: str = C.CAPTION
    seed: int = 0  # the base-set choice; each row's shuffle is seeded by this and the row's id
    num_proc: int = 1

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
                f"{base_ops()} count words on the base captions, and --base-frac 0 leaves none; "
                "drop them from --ops or give --base-frac > 0"
            )
        if self.num_proc < 1:
            problems.append("--num-proc must be >= 1")
        if problems:
            raise UsageError("; ".join(problems))
        return ops


def fit_vocabulary(base_captions: Sequence[str], ops: Ops, stopwords: frozenset[str]) -> Vocabulary:
    """Base vocabulary and the t most frequent base words.

    A word's frequency is the number of base captions containing it, over every alphabetic token
    (stop words included). Ties at the t-th place are broken alphabetically.
    """
    return _vocabulary(*_count_base(base_captions), ops, stopwords)


def _count_base(texts: Iterable[str | None]) -> tuple[set[str], Counter]:
    """The tokens of `texts`, and each alphabetic token's number of texts."""
    vocab: set[str] = set()
    df: Counter = Counter()
    for text in texts:
        toks = set(tokenize(text or ""))
        vocab |= toks
        df.update(t for t in toks if t.isalpha())
    return vocab, df


def _vocabulary(vocab: set[str], df: Counter, ops: Ops, stopwords: frozenset[str]) -> Vocabulary:
    top = sorted(df.items(), key=lambda kv: (-kv[1], kv[0]))[: ops.param("rmtopfreq") or 0]
    return Vocabulary(
        stopwords=stopwords,
        base_vocab=frozenset(vocab) if "basevocab" in ops else None,
        top_words=[w for w, _ in top],
        top_counts=[c for _, c in top],
    )


def _keep_predicate(ops: Ops, vocab: Vocabulary) -> Callable[[str], bool] | None:
    """The filters' fast forms folded into one test per token (None: every token survives)."""
    parts = [op.fast(vocab) for op, _ in ops.of(FilterOp)]
    allows = [p.allow for p in parts if p.allow is not None]
    drop = frozenset().union(*(p.drop for p in parts))
    tests = [p.test for p in parts if p.test is not None]
    if allows:  # one set lookup: the allowed tokens that pass every other filter
        allowed = {t for t in frozenset.intersection(*allows) if t not in drop and all(f(t) for f in tests)}
        return allowed.__contains__
    if len(tests) == 1:
        test = tests[0]
        return lambda t: test(t) and t not in drop
    if tests:
        return lambda t: all(f(t) for f in tests) and t not in drop
    if drop:
        return lambda t: t not in drop
    return None


def deform_caption(text: str, ops: Ops, vocab: Vocabulary, seed: int) -> tuple[str, list[str]]:
    """Reference implementation, one caption at a time, from each operation's reference form: (deformed
    text, removed tokens). `seed` is the row's seed (`row_seed`)."""
    filters = ops.of(FilterOp)
    kept, removed = [], []
    for t in tokenize(text or ""):
        (kept if all(op.reference(t, vocab) for op, _ in filters) else removed).append(t)
    for op, _ in ops.of(OrderOp):
        kept = op.reference(kept, seed)
    for op, value in ops.of(CutOp):
        cut = op.reference(kept, value)
        removed += kept[len(cut):]
        kept = cut
    return " ".join(kept), removed


def deform_batch(
    texts: Sequence[str], ids: Sequence[str], seed: int, ops: Ops, vocab: Vocabulary
) -> tuple[list[str], Counter]:
    """Fast implementation of `deform_caption` over many captions, from each operation's fast form: same
    outputs (the filters in one token test, the shuffles vectorised)."""
    keep_token = _keep_predicate(ops, vocab)
    kept_lists: list[list[str]] = []
    all_tokens: list[str] = []  # removed words = all tokens minus the ones that survive
    for text in texts:
        toks = tokenize(text or "")
        all_tokens.extend(toks)
        kept_lists.append([t for t in toks if keep_token(t)] if keep_token is not None else toks)
    lens = np.fromiter((len(k) for k in kept_lists), dtype=np.int64, count=len(kept_lists))
    flat = [t for k in kept_lists for t in k]
    for op, _ in ops.of(OrderOp):
        flat = op.fast(flat, lens, ids, seed)
    cuts = ops.of(CutOp)
    out = []
    start = 0
    survivors: list[str] = []
    for n in lens.tolist():
        m = n
        for op, value in cuts:
            m = op.fast(m, value)
        row = flat[start : start + m]
        survivors.extend(row)
        out.append(" ".join(row))
        start += n
    removed = Counter(all_tokens)
    removed.subtract(Counter(survivors))
    return out, +removed  # unary plus drops the zero counts


def choose_base(n: int, base_frac: float, seed: int) -> np.ndarray:
    """(n,) bool: a seeded random round(base_frac * n) rows form the base set."""
    mask = np.zeros(n, dtype=bool)
    k = int(round(base_frac * n))
    if k:
        mask[np.random.default_rng(seed).choice(n, size=k, replace=False)] = True
    return mask


# Worker state for fork-based multiprocessing: set before a pool starts, inherited by its workers.
_WORK: dict = {}
MIN_ROWS_PER_PROC = 20_000  # below this, one process is faster than starting a pool


def _fit_work(texts: list[str]) -> tuple[set, Counter]:
    """Tokens and caption frequencies of a slice of the base captions."""
    return _count_base(texts)


def _deform_work(task: tuple[list[str], list[str]]) -> tuple[list[str], Counter, int, int]:
    """Deform a slice of (texts, ids) with the pool's ops, vocabulary and seed (in _WORK)."""
    return _deform_slice(*task, _WORK["seed"], _WORK["ops"], _WORK["vocab"])


def _deform_slice(texts: list[str], ids: list[str], seed: int, ops: Ops, vocab: Vocabulary) -> tuple[list[str], Counter, int, int]:
    out, removed = deform_batch(texts, ids, seed, ops, vocab)
    # words in and out (outputs are tokens joined by single spaces)
    return out, removed, sum(len(t.split()) for t in texts if t), sum(t.count(" ") + 1 for t in out if t)


def _spans(n: int, num_proc: int) -> list[tuple[int, int]]:
    chunk = max(MIN_ROWS_PER_PROC // 2, -(-n // (num_proc * 4)), 1)
    return [(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]


PROGRESS_ROWS = 50_000  # a progress bar (rows, rate, time left) for loops over more rows than this


@dataclass
class Workers:
    pool: Any  # a multiprocessing Pool
    processes: int


@contextlib.contextmanager
def workers(num_proc: int, rows: int, **state) -> Iterator[Workers | None]:
    """One fork pool of `num_proc` processes for a whole pass over `rows` rows (None: work in this process,
    for one process or too few rows to pay a pool's start). `state` (the ops, vocabulary and seed) is set
    before the fork, so each worker inherits it once; the rows go to the workers a slice per task."""
    if num_proc <= 1 or rows < MIN_ROWS_PER_PROC * 2:
        yield None
        return
    import multiprocessing as mp

    _WORK.update(state)
    try:
        with mp.get_context("fork").Pool(num_proc) as pool:
            yield Workers(pool, num_proc)
    finally:
        _WORK.clear()


def fit_vocabulary_chunks(chunks: Iterable[list[str]], ops: Ops, stopwords: frozenset[str], pool: Workers | None = None) -> Vocabulary:
    """`fit_vocabulary` over the base captions given a chunk at a time, each chunk's counting spread over the
    pool's processes (the same result for any chunking and any pool: the counts add up)."""
    vocab: set[str] = set()
    df: Counter = Counter()
    for texts in chunks:
        if pool is None or len(texts) < MIN_ROWS_PER_PROC * 2:
            parts = [_count_base(texts)]
        else:
            parts = pool.pool.map(_fit_work, [texts[lo:hi] for lo, hi in _spans(len(texts), pool.processes)])
        for v, d in parts:
            vocab |= v
            df.update(d)
    return _vocabulary(vocab, df, ops, stopwords)


def deform_texts(
    texts: list[str], ids: list[str], is_base: np.ndarray, ops: Ops, vocab: Vocabulary, seed: int, pool: Workers | None = None,
    label: str | None = "deform",
) -> tuple[list[str], Counter, int, int]:
    """Deform the non-base rows of `texts` (base rows unchanged), in the pool's processes when it is given
    (`workers(...)` with this ops, vocab and seed); `label`: the progress bar's (None: none).

    Returns (texts, removed words, words of the input, words of the output)."""
    idx = np.flatnonzero(~is_base).tolist()
    sub_texts = [texts[i] for i in idx]
    sub_ids = [ids[i] for i in idx]
    n = len(sub_texts)
    in_pool = pool is not None and n >= MIN_ROWS_PER_PROC * 2
    spans = _spans(n, pool.processes) if in_pool else [(lo, min(n, lo + MIN_ROWS_PER_PROC)) for lo in range(0, n, MIN_ROWS_PER_PROC)]
    tasks = [(sub_texts[lo:hi], sub_ids[lo:hi]) for lo, hi in spans]
    done = pool.pool.imap(_deform_work, tasks) if in_pool else (_deform_slice(*t, seed, ops, vocab) for t in tasks)
    parts = []
    with Bar(label or "", n, unit="rows", enabled=label is not None and n > PROGRESS_ROWS) as bar:
        for (lo, hi), part in zip(spans, done):
            parts.append(part)
            bar.advance(hi - lo)
    removed: Counter = Counter()
    result = list(texts)
    base_words = sum(len(texts[i].split()) for i in np.flatnonzero(is_base).tolist() if texts[i])
    words_in, words_out = base_words, base_words
    j = 0
    for outs, r, w_in, w_out in parts:
        removed.update(r)
        words_in += w_in
        words_out += w_out
        for o in outs:
            result[idx[j]] = o
            j += 1
    return result, removed, words_in, words_out


TEXT_CHUNK = 50_000  # rows whose texts are Python strings at a time (deform_dataset)


def _fingerprint(parent: str, config: DeformConfig) -> str:
    return hashlib.blake2b(f"{parent}|deform|{config}".encode(), digest_size=8).hexdigest()


@dataclass
class Deformed:
    """The deformed column, chunk by chunk: the new texts and is_base (a table, in memory or spilled), the
    rows kept, and what the operations removed."""

    columns: Any  # pyarrow.Table: (text column, is_base), one row per input row
    keep: np.ndarray  # (n,) bool: a base row with text, a deformed row left non-empty
    removed: Counter  # word -> times removed
    words_in: int
    words_out: int


def deform_dataset(ds, config: DeformConfig, spill: Path | None = None) -> tuple[object, dict]:
    """Deform `ds[config.text_column]`; return the new dataset (empty rows dropped) and its statistics.

    `spill`: a directory for the new columns and the kept rows' indices, written there TEXT_CHUNK rows at
    a time and memory-mapped back, so that memory stays O(TEXT_CHUNK) at any number of rows; it must
    outlive the returned dataset's use. None: they are held in memory.
    Stages: text_feature -> choose_base -> fit_base_vocabulary -> deform_column -> replace_text_column -> deform_stats.
    """
    import datasets  # (lazy, as in every function here: commands/deform.py imports this module, and `vltool --help` stays fast)

    ops = config.validate()
    feature = text_feature(ds, config.text_column)
    texts_col, ids_col = arrow_column(ds, config.text_column), arrow_column(ds, C.ID)  # Arrow: no Python objects
    n = len(texts_col)
    stop = english_stopwords()
    stopwords = stop.words
    is_base = choose_base(n, config.base_frac, config.seed)  # (n,) bool
    vocab = fit_base_vocabulary(texts_col, is_base, ops, stopwords, config.num_proc)
    col_type = ds.data.schema.field(config.text_column).type
    done = deform_column(texts_col, ids_col, is_base, ops, vocab, config, col_type, spill)
    # The output is the input's memory-mapped table beside the new columns, with the kept rows as an indices
    # mapping (vltool.derived): neither the images nor the new texts are copied into memory.
    original_col = C.CAPTION_ORIGINAL if config.text_column == C.CAPTION else f"{config.text_column}_original"
    out = replace_text_column(
        ds, config.text_column, original_col, done.columns, {config.text_column: feature, C.IS_BASE: datasets.Value("bool")}, done.keep,
        fingerprint=_fingerprint(ds._fingerprint, config), spill=spill, chunk=TEXT_CHUNK,
    )
    return out, deform_stats(done, is_base, vocab, ops, stop)


def text_feature(ds, text_column: str):
    """The feature of --text-column, which must hold strings (and the data an id column)."""
    import datasets

    require_columns(ds, [C.ID, text_column], "the input")
    feature = ds.features[text_column]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        raise UsageError(f"--text-column {text_column!r} is not a text column (its type is {feature})")
    return feature


def fit_base_vocabulary(texts_col, is_base: np.ndarray, ops: Ops, stopwords: frozenset[str], num_proc: int) -> Vocabulary:
    """The vocabulary of the base rows' texts, TEXT_CHUNK rows at a time (a take over the whole column would copy it)."""
    import pyarrow as pa

    n = len(texts_col)
    with workers(num_proc, int(is_base.sum())) as pool:
        return fit_vocabulary_chunks(
            (texts_col.slice(a, TEXT_CHUNK).filter(pa.array(is_base[a : a + TEXT_CHUNK])).to_pylist() for a in range(0, n, TEXT_CHUNK)),
            ops, stopwords, pool,
        )


def deform_column(texts_col, ids_col, is_base: np.ndarray, ops: Ops, vocab: Vocabulary, config: DeformConfig, col_type,
                  spill: Path | None) -> Deformed:
    """The texts deformed TEXT_CHUNK rows at a time (a row's result depends on its own text, its id and the
    seed only), so Python holds one chunk of strings, not the whole column; the new column is Arrow, in
    memory or spilled to a file. A base row stays intact, but a row without text, base or not, is dropped
    (None, "" and whitespace are no text)."""
    import pyarrow as pa

    n = len(texts_col)
    new_cols = ColumnSpill(spill and spill / "columns.arrow", pa.schema([(config.text_column, col_type), (C.IS_BASE, pa.bool_())]))
    done = Deformed(None, np.zeros(n, dtype=bool), Counter(), 0, 0)
    with Bar("deform", n, unit="rows", enabled=n > PROGRESS_ROWS) as bar, \
            workers(config.num_proc, n, ops=ops, vocab=vocab, seed=config.seed) as pool:  # one pool for every chunk
        for a in range(0, n, TEXT_CHUNK):
            b = min(n, a + TEXT_CHUNK)
            texts = texts_col.slice(a, b - a).to_pylist()
            ids = ids_col.slice(a, b - a).to_pylist()
            new, r, w_in, w_out = deform_texts(texts, ids, is_base[a:b], ops, vocab, config.seed, pool, label=None)
            done.removed.update(r)
            done.words_in, done.words_out = done.words_in + w_in, done.words_out + w_out
            done.keep[a:b] = np.where(is_base[a:b], has_text(texts_col.slice(a, b - a), lists=False),
                                      np.fromiter(map(bool, new), dtype=bool, count=b - a))
            new_cols.add([pa.array(new, type=col_type), pa.array(is_base[a:b])])
            bar.advance(b - a)
    done.columns = new_cols.table()
    return done


def deform_stats(done: Deformed, is_base: np.ndarray, vocab: Vocabulary, ops: Ops, stop: StopWords) -> dict:
    """The statistics: rows kept and dropped, caption lengths before and after, the vocabulary's sizes,
    the words removed most, and a warning when rmtopfreq removes the whole base vocabulary."""
    n, keep = len(is_base), done.keep
    rows_out = int(keep.sum())
    warnings = []
    t = ops.param("rmtopfreq")
    if t is not None and len(vocab.top_words) < t:
        warnings.append(
            f"rmtopfreq{t} removes every one of the {len(vocab.top_words)} alphabetic words of the "
            f"{int(is_base.sum())} base captions, so only words outside the base vocabulary survive "
            "(none, with basevocab); the paper's t=1000 is for millions of captions: choose a smaller t here"
        )
    top_removed = [
        [w, c] for w, c in sorted(done.removed.items(), key=lambda kv: (-kv[1], kv[0])) if w.isalpha() and w not in stop.words
    ][:20]
    return {
        "ops": str(ops),
        "rows_in": n,
        "rows_out": rows_out,
        "rows_dropped_empty": n - rows_out,
        "base_rows": int((is_base & keep).sum()),  # in the output (a base row without text is dropped too)
        "deformed_rows": int((~is_base & keep).sum()),
        "avg_caption_len_before": round(done.words_in / n, 3) if n else 0.0,
        "avg_caption_len_after": round(done.words_out / rows_out, 3) if rows_out else 0.0,
        "dataset_size_change_pct": round(100.0 * (rows_out - n) / n, 2) if n else 0.0,
        "base_vocab_size": len(vocab.base_vocab) if vocab.base_vocab is not None else None,
        "rmtopfreq_words": [[w, c] for w, c in zip(vocab.top_words[:20], vocab.top_counts[:20])],
        "top_removed_words": top_removed,
        "stopwords": stop.source,
        "stopwords_sha256": stop.sha256,
        "warnings": warnings,
    }


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
    from vltool.checks import require_texts
    from vltool.io.atomic import save_dataset
    from vltool.io.loading import load_dataset
    from vltool.io.locks import output_scope
    from vltool.io.outputs import check_output

    timer = provenance.Timer()
    config.validate()
    src = load_dataset(data, split=split, where=where, required=[C.ID], texts=[config.text_column])
    with_text = int(has_text(arrow_column(src.dataset, config.text_column), lists=False).sum())  # whole-column Arrow work
    require_texts(with_text, src.rows, config.text_column, data)
    with output_scope():  # out's lock until the end (a CLI command holds it already), so no write cleans the spill
        out = check_output(out, overwrite, inputs=[*src.reads])
        with spill_beside(out) as spill:
            ds, stats = deform_dataset(src.dataset, config, spill=spill)
            prov = provenance.make(
                "deform", config, [src], rows_in=stats["rows_in"], rows_out=stats["rows_out"], stats=stats, timer=timer
            )
            save_dataset(ds, out, prov, overwrite=overwrite, num_proc=config.num_proc)
    prov["wall_time_s"] = round(timer.seconds, 3)
    return prov
