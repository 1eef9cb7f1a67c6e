"""`vltool filter`: keep the captions a bag-of-n-grams classifier calls reference-like.

Santurkar et al. (section 4, appendix A.7) train fastText, a linear classifier on bag-of-n-gram sentence
embeddings (n=2), to tell captions of a source dataset (CC, YFCC) from COCO's, and keep the source
captions classified as COCO-like. This module does the same in PyTorch (docs/recaption-filter.md):

- Text to features: lower-case; every character that is neither a letter, a digit nor whitespace is a
  token of its own; words are the whitespace-separated rest. Each word is hashed (BLAKE2b, 64 bits);
  unigrams and word n-grams up to `ngrams` are hashed into `buckets` buckets, as fastText does for its
  n-grams. `featurize` does this for a whole column at once with Arrow kernels; `featurize_one` is the
  plain-Python reference it is tested against.
- Model (fastText's): the mean of the features' embeddings (`EmbeddingBag`, `dim`), then a linear layer
  to one logit, trained with class-balanced logistic loss and a small L2 penalty (calibrated scores).
- Cross-fitting: each set is cut into `folds` random parts; classifier f trains on the other parts of
  both sets (80% for 5 folds) and scores part f. Every source row is scored by a classifier that never
  saw it (a classifier scoring its own training rows calls them "source" more than it should: it has
  learnt them), and the held-out accuracy is measured on every row once.
- Scoring: the model is linear in the mean embedding, so mean(E[ids]) @ w + b == mean(E[ids] @ w) + b:
  each bucket's contribution `E @ w` is one number, and scoring a caption is a table look-up and a mean
  (`Scorer`), hundreds of thousands of captions per second.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets.table import InMemoryTable
from torch import nn

from vltool import columns as C
from vltool import provenance
from vltool.checks import has_text, missing_text_warning, require_texts
from vltool.console import Bar, log
from vltool.derived import with_columns
from vltool.errors import UsageError
from vltool.io.atomic import save_dataset
from vltool.io.digests import arrow_column
from vltool.io.heldout import test_only_inputs
from vltool.io.loading import load_dataset, require_columns
from vltool.io.outputs import check_output
from vltool.topology import warn

_MASK = (1 << 64) - 1
_FNV_PRIME = 0x100000001B3  # mixes the next word's hash into an n-gram key
_PUNCT_RE2 = r"([^\pL\pN\s])"  # Arrow (RE2): a non-letter, non-digit, non-space character
_PUNCT_ASCII = r"([^a-z0-9\s\x0b\x1c-\x1f])|[\x1c-\x1f]"  # the same on ASCII text (\x0b, \x1c-\x1f are spaces)
_PUNCT_PY = r"([^\w\s]|_)"  # the same class in Python's `re` (\w includes "_", which RE2's \pL\pN does not)
_CHUNK = 1 << 16  # captions featurized at once (bounds memory; chunks run on threads)


@dataclass
class FilterConfig:
    """Options of `vltool filter`, one field per option of the same name (help: `vltool filter --help`)."""

    text_column: str = C.CAPTION
    reference_column: str | None = None  # None: text_column
    threshold: float | None = None  # None: 0.5 unless keep_frac is given (resolved_threshold)
    keep_frac: float | None = None
    folds: int = 5
    ngrams: int = 2
    buckets: int = 1 << 20  # fastText uses 2M for its n-grams
    dim: int = 8  # binary task: the classifier is linear whatever the size
    epochs: int = 5  # fastText's default
    min_steps: int = 100
    l2: float = 0.01  # per batch: keeps the scores calibrated, so that the 0.5 threshold means something
    lr: float = 0.05
    batch_size: int = 256
    seed: int = 0  # the train/held-out split, initialisation, batch order, shown examples
    num_examples: int = 5
    allow_test_data: bool = False  # the reference may be built-in test-only data (io.test_only_inputs)

    @property
    def resolved_threshold(self) -> float | None:
        if self.keep_frac is not None:
            return None
        return 0.5 if self.threshold is None else self.threshold

    def validate(self) -> None:
        problems = []
        if self.threshold is not None and self.keep_frac is not None:
            problems.append("give --threshold or --keep-frac, not both")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            problems.append(f"--threshold must be in [0, 1], got {self.threshold}")
        if self.keep_frac is not None and not 0.0 < self.keep_frac <= 1.0:
            problems.append(f"--keep-frac must be in (0, 1], got {self.keep_frac}")
        if not 1 <= self.folds <= 20:
            problems.append(f"--folds must be 1 to 20, got {self.folds}")
        if not 1 <= self.ngrams <= 5:
            problems.append(f"--ngrams must be 1 to 5, got {self.ngrams}")
        if not 16 <= self.buckets <= 1 << 26:
            problems.append(f"--buckets must be in [16, 2^26], got {self.buckets}")
        if self.min_steps < 0:
            problems.append(f"--min-steps must be >= 0, got {self.min_steps}")
        for name, value in (("--dim", self.dim), ("--epochs", self.epochs), ("--batch-size", self.batch_size)):
            if value < 1:
                problems.append(f"{name} must be >= 1, got {value}")
        if not self.lr > 0:
            problems.append(f"--lr must be > 0, got {self.lr}")
        if self.num_examples < 0:
            problems.append(f"--num-examples must be >= 0, got {self.num_examples}")
        if problems:
            raise UsageError("; ".join(problems))


# ---------------------------------------------------------------------------------------------------------
# Features


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A 64-bit finaliser on a uint64 array (wrap-around arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _splitmix64_int(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def word_hash(word: str) -> int:
    """A word's stable 64-bit hash (the same in every process and run, unlike Python's hash())."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class _HashCache(dict):
    """word -> word_hash(word), computed once per distinct word."""

    def __missing__(self, word: str) -> int:
        h = self[word] = word_hash(word)
        return h


_WORD_HASHES = _HashCache()


def tokenize_one(text: str | None) -> list[str]:
    """Reference tokenizer: lower-case, punctuation characters as tokens of their own, split on whitespace."""
    return re.sub(_PUNCT_PY, r" \1 ", (text or "").lower()).split()


def featurize_one(text: str | None, buckets: int, ngrams: int) -> list[int]:
    """Reference implementation: the bucket ids of one caption's unigrams, then bigrams, ... up to `ngrams`.

    An n-gram's key is built word by word: key_1 = hash(w_i), key_n = key_{n-1} * P + hash(w_{i+n-1})
    (mod 2^64); its bucket is splitmix64(key_n XOR n) mod buckets.
    """
    hashes = [word_hash(t) for t in tokenize_one(text)]
    feats: list[int] = []
    keys = list(hashes)
    for n in range(1, ngrams + 1):
        if n > 1:
            keys = [(keys[i] * _FNV_PRIME + hashes[i + n - 1]) & _MASK for i in range(len(keys) - 1)]
        feats.extend(_splitmix64_int(k ^ n) % buckets for k in keys)
    return feats


def _as_arrow(texts):
    """Texts as a pyarrow ChunkedArray of strings."""
    if isinstance(texts, pa.ChunkedArray):
        return texts
    if isinstance(texts, pa.Array):
        return pa.chunked_array([texts])
    return pa.chunked_array([pa.array(list(texts), type=pa.large_string())])


def _featurize_chunk(arr, buckets: int, ngrams: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, owner, tokens_per_caption) of one Arrow string array; owner[i] is the caption of feature i."""
    n = len(arr)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        pass
    else:
        arr = arr.cast(pa.large_string())
    arr = pc.fill_null(arr, "")
    if n and pc.all(pc.string_is_ascii(arr)).as_py():  # the same tokens, 3x faster with ASCII kernels
        spaced = pc.replace_substring_regex(pc.ascii_lower(arr), pattern=_PUNCT_ASCII, replacement=r" \1 ")
        lists = pc.ascii_split_whitespace(spaced)
    else:
        spaced = pc.replace_substring_regex(pc.utf8_lower(arr), pattern=_PUNCT_RE2, replacement=r" \1 ")
        lists = pc.utf8_split_whitespace(spaced)
    offsets = lists.offsets.to_numpy().astype(np.int64)
    lengths = np.diff(offsets)  # (n,) tokens per caption, empty strings included
    flat = lists.flatten()
    owner_tok = np.repeat(np.arange(n, dtype=np.int64), lengths)  # (T,)
    if len(flat):
        enc = pc.dictionary_encode(flat)
        words = enc.dictionary.to_pylist()
        table = np.fromiter(map(_WORD_HASHES.__getitem__, words), dtype=np.uint64, count=len(words))
        idx = enc.indices.to_numpy()
        h = table[idx]  # (T,) word hashes
        if "" in words:  # splitting yields "" at leading, trailing and doubled spaces
            keep = idx != words.index("")
            h, owner_tok = h[keep], owner_tok[keep]
    else:
        h = np.zeros(0, dtype=np.uint64)
    ids, owners = [], []
    keys = h  # (T - k + 1,) key of the k-gram starting at each token
    for k in range(1, ngrams + 1):
        if k > 1:
            with np.errstate(over="ignore"):
                keys = keys[:-1] * np.uint64(_FNV_PRIME) + h[k - 1 :]
            same = owner_tok[k - 1 :] == owner_tok[: len(keys)]  # first and last word in one caption
            keys_k, own_k = keys[same], owner_tok[: len(keys)][same]
        else:
            keys_k, own_k = keys, owner_tok
        ids.append((splitmix64(keys_k ^ np.uint64(k)) % np.uint64(buckets)).astype(np.int64))
        owners.append(own_k)
    return np.concatenate(ids), np.concatenate(owners), np.bincount(owner_tok, minlength=n)


def _map_chunks(fn, texts) -> list:
    """fn(arrow string array) over chunks of `texts`, in order, on up to two threads (Arrow and numpy
    release the GIL, so chunks featurize in parallel). At most one chunk per thread waits or runs at a
    time, so the memory in flight is a few chunks', whatever the number of rows."""
    ca = _as_arrow(texts)
    starts = range(0, len(ca), _CHUNK)
    piece = lambda lo: fn(ca.slice(lo, _CHUNK).combine_chunks())  # noqa: E731
    threads = min(2, os.cpu_count() or 1)
    if len(starts) <= 1 or threads == 1:
        return [piece(lo) for lo in starts]
    done, pending = [], deque()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for lo in starts:
            pending.append(pool.submit(piece, lo))
            if len(pending) > threads:
                done.append(pending.popleft().result())
        done.extend(f.result() for f in pending)
    return done


def featurize(texts, buckets: int, ngrams: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashed n-gram features of many captions: (ids (F,) int64, offsets (n+1,) int64), caption i owning
    ids[offsets[i]:offsets[i+1]] in the order of `featurize_one` (unigrams, then bigrams, ...).
    `texts` is a list of strings (None is empty) or an Arrow string array."""
    f = Features.of(texts, buckets, ngrams)
    return f.ids.astype(np.int64), f.offsets


@dataclass
class Features:
    """Hashed n-gram bucket ids of many captions in CSR form: caption i owns ids[offsets[i]:offsets[i+1]],
    in the order of `featurize_one`. 4 bytes per n-gram (buckets < 2^31), 8 per caption."""

    ids: np.ndarray  # (F,) int32 bucket ids
    offsets: np.ndarray  # (n+1,) int64

    @classmethod
    def of(cls, texts, buckets: int, ngrams: int) -> "Features":
        def one(piece):
            ids, owner, _ = _featurize_chunk(piece, buckets, ngrams)
            order = np.argsort(owner, kind="stable")  # group by caption, keeping unigram-then-bigram order
            return ids[order].astype(np.int32), np.bincount(owner, minlength=len(piece))

        done = _map_chunks(one, texts)
        offsets = np.zeros(sum(len(d[1]) for d in done) + 1, dtype=np.int64)
        if done:
            np.cumsum(np.concatenate([d[1] for d in done]), out=offsets[1:])
        ids = np.concatenate([d[0] for d in done]) if done else np.zeros(0, dtype=np.int32)
        return cls(ids, offsets)

    def bags(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The features of `rows`, one bag after the other: (ids (sum of lengths,), bag starts (B,))."""
        starts, lens = self.offsets[rows], self.offsets[rows + 1] - self.offsets[rows]  # (B,), (B,)
        bag_starts = np.cumsum(lens) - lens  # (B,) where each row's bag starts in the batch
        # feature j of the batch is ids[starts[row] + (j - bag_starts[row])]
        gather = np.repeat(starts - bag_starts, lens) + np.arange(lens.sum())
        return self.ids[gather], bag_starts

    def seen(self, rows: np.ndarray, buckets: int) -> np.ndarray:
        """(buckets,) bool: the buckets that any of `rows` holds (a pass over the rows in slices)."""
        out = np.zeros(buckets, dtype=bool)
        for lo in range(0, len(rows), _CHUNK):
            out[self.bags(rows[lo : lo + _CHUNK])[0]] = True
        return out


# ---------------------------------------------------------------------------------------------------------
# Model


def make_model(rows: int, dim: int, seed: int):
    """fastText's classifier: mean of n-gram embeddings -> linear -> one logit (reference-like).

    `rows` embedding rows, one per bucket seen in training, plus a last all-zero padding row for
    n-grams never seen in training: EmbeddingBag leaves padding entries out of the mean.
    """
    class FastTextClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            # fastText: input vectors uniform(-1/dim, 1/dim), output weights zero
            weight = torch.empty(rows + 1, dim).uniform_(-1.0 / dim, 1.0 / dim, generator=g)
            weight[rows] = 0.0
            self.embedding = nn.EmbeddingBag(rows + 1, dim, mode="mean", sparse=True, padding_idx=rows, _weight=weight)
            self.linear = nn.Linear(dim, 1)
            with torch.no_grad():
                self.linear.weight.zero_()
                self.linear.bias.zero_()

        def forward(self, ids, offsets):  # ids (F,), offsets (B,) -> logits (B,)
            return self.linear(self.embedding(ids, offsets)).squeeze(-1)

    return FastTextClassifier()


@dataclass
class Classifier:
    """A trained model and the buckets it knows (its embedding row r is bucket vocab[r])."""

    model: Any
    vocab: np.ndarray  # (U,) sorted bucket ids seen in training
    buckets: int
    ngrams: int

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Bucket ids -> embedding rows; unseen buckets -> the padding row U."""
        u = len(self.vocab)
        pos = np.searchsorted(self.vocab, ids)
        hit = pos < u
        hit[hit] = self.vocab[pos[hit]] == ids[hit]
        return np.where(hit, pos, u)

    def logits(self, texts) -> np.ndarray:
        """Reference implementation of Scorer.logits: the PyTorch model on the features."""
        ids, offsets = featurize(texts, self.buckets, self.ngrams)
        with torch.no_grad():
            out = self.model(torch.from_numpy(self.rows(ids)), torch.from_numpy(offsets[:-1]))
        return out.double().numpy()


@dataclass
class Scorer:
    """The trained classifier folded into one number per bucket: logit = mean(table[ids] over the
    caption's n-grams seen in training) + bias."""

    table: np.ndarray  # (buckets,) float64: E @ w, each bucket's contribution (0 for unseen buckets)
    seen: np.ndarray  # (buckets,) float64: 1 for buckets seen in training, 0 otherwise
    bias: float
    buckets: int
    ngrams: int

    @classmethod
    def from_classifier(cls, clf: Classifier) -> "Scorer":
        with torch.no_grad():
            emb = clf.model.embedding.weight[: len(clf.vocab)]  # (U, dim)
            contrib = (emb @ clf.model.linear.weight.T).squeeze(1).double().numpy()  # (U,)
            bias = float(clf.model.linear.bias.double().item())
        table = np.zeros(clf.buckets, dtype=np.float64)
        seen = np.zeros(clf.buckets, dtype=np.float64)
        table[clf.vocab] = contrib
        seen[clf.vocab] = 1.0
        return cls(table, seen, bias, clf.buckets, clf.ngrams)

    def logits(self, texts) -> np.ndarray:
        """(n,) float64 logits of "reference-like"; a caption with no known n-gram gets the bias."""

        def one(piece) -> np.ndarray:
            ids, owner, _ = _featurize_chunk(piece, self.buckets, self.ngrams)
            n = len(piece)
            total = np.bincount(owner, weights=self.table[ids], minlength=n)  # (n,) sum of contributions
            count = np.bincount(owner, weights=self.seen[ids], minlength=n)  # (n,) known n-grams
            return total / np.maximum(count, 1.0) + self.bias

        parts = _map_chunks(one, texts)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)

    def scores(self, texts) -> np.ndarray:
        """(n,) probability of "reference-like"."""
        return 1.0 / (1.0 + np.exp(-self.logits(texts)))

    def row_scores(self, feats: Features, rows: np.ndarray) -> np.ndarray:
        """`scores` of the captions at `rows` of `feats` (the same numbers, bit for bit: each caption's
        n-grams are summed in the same order), in slices of rows."""
        out = np.empty(len(rows), dtype=np.float64)
        for lo in range(0, len(rows), _CHUNK):
            ids, starts = feats.bags(rows[lo : lo + _CHUNK])
            n = len(starts)
            owner = np.repeat(np.arange(n), np.diff(np.append(starts, len(ids))))  # (F,) caption of each n-gram
            total = np.bincount(owner, weights=self.table[ids], minlength=n)
            count = np.bincount(owner, weights=self.seen[ids], minlength=n)
            out[lo : lo + n] = total / np.maximum(count, 1.0) + self.bias
        return 1.0 / (1.0 + np.exp(-out))


def train_classifier(
    ref_texts: Sequence[str], src_texts: Sequence[str], config: FilterConfig, log=None, bar=None
) -> tuple[Classifier, dict]:
    """Fit the classifier on reference (label 1) and source (label 0) texts; classes weigh equally.
    `bar` (a vltool.console.Bar) advances by one per training step. The plain path: `train_on_rows`
    trains the same model on features made once for every classifier (`filter_dataset`)."""
    ids_r, off_r = featurize(ref_texts, config.buckets, config.ngrams)
    ids_s, off_s = featurize(src_texts, config.buckets, config.ngrams)
    # one CSR over both sets, reference rows first, over the buckets seen here (compact embedding rows)
    vocab, ids = np.unique(np.concatenate([ids_r, ids_s]), return_inverse=True)
    compact = Features(ids.astype(np.int64), np.concatenate([off_r[:-1], off_s + off_r[-1]]))
    model, stats = _fit(compact.bags, len(off_r) - 1, len(off_s) - 1, len(vocab), config, log, bar)
    return Classifier(model, vocab, config.buckets, config.ngrams), {"known_buckets": int(len(vocab)), **stats}


def train_on_rows(feats: Features, ref_rows: np.ndarray, src_rows: np.ndarray, config: FilterConfig, log=None,
                  bar=None) -> tuple[Classifier, dict]:
    """`train_classifier(texts of ref_rows, texts of src_rows)` on rows of `feats`: the same model, bit for
    bit, without featurizing again or copying the training rows' features (O(buckets) memory besides `feats`)."""
    rows = np.concatenate([ref_rows, src_rows])  # (n,) training row i -> row of feats, reference rows first
    seen = feats.seen(rows, config.buckets)  # (buckets,)
    vocab = np.flatnonzero(seen)  # (U,) sorted, as np.unique numbers them
    lookup = np.cumsum(seen, dtype=np.int32) - 1  # (buckets,) bucket -> embedding row (for seen buckets)
    del seen

    def bags(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids, starts = feats.bags(rows[batch])
        return lookup[ids].astype(np.int64), starts

    model, stats = _fit(bags, len(ref_rows), len(src_rows), len(vocab), config, log, bar)
    return Classifier(model, vocab, config.buckets, config.ngrams), {"known_buckets": int(len(vocab)), **stats}


def _fit(bags, n_r: int, n_s: int, rows: int, config: FilterConfig, log, bar):
    """Class-balanced training on n_r reference rows then n_s source rows; bags(batch rows) gives the
    batch's embedding rows and bag starts."""
    n = n_r + n_s
    y = np.concatenate([np.ones(n_r, np.float32), np.zeros(n_s, np.float32)])
    w = np.concatenate([np.full(n_r, n / (2 * n_r), np.float32), np.full(n_s, n / (2 * n_s), np.float32)])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steps are tiny sparse updates: more threads only add synchronisation
    try:
        return _train(bags, y, w, rows, config, log, bar)
    finally:
        torch.set_num_threads(threads)


def training_steps(n: int, config: FilterConfig) -> int:
    """The optimizer steps of one classifier trained on `n` texts."""
    steps_per_epoch = -(-n // config.batch_size)
    return steps_per_epoch * max(config.epochs, -(-config.min_steps // steps_per_epoch))


def _train(bags, y: np.ndarray, w: np.ndarray, rows: int, config: FilterConfig, log, bar=None):
    n = len(y)
    torch.manual_seed(config.seed)
    model = make_model(rows, config.dim, config.seed)
    # fastText updates one row at a time with SGD; on batches, Adam (sparse for the embedding table) is
    # stable where batched SGD with fastText's step size is not. The learning rate decays linearly to 0.
    opts = [
        torch.optim.SparseAdam(list(model.embedding.parameters()), lr=config.lr),
        torch.optim.Adam(list(model.linear.parameters()), lr=config.lr),
    ]
    steps_per_epoch = -(-n // config.batch_size)
    epochs = max(config.epochs, -(-config.min_steps // steps_per_epoch))
    total_steps = steps_per_epoch * epochs
    rng = np.random.default_rng(config.seed)
    y_t, w_t = torch.from_numpy(y), torch.from_numpy(w)
    step = 0
    losses = []
    for epoch in range(epochs):
        perm = rng.permutation(n)
        epoch_loss = 0.0
        for lo in range(0, n, config.batch_size):
            rows = perm[lo : lo + config.batch_size]
            ids, starts = bags(rows)
            batch_ids, batch_off = torch.from_numpy(ids), torch.from_numpy(starts)  # (sum of lengths,), (B,)
            rows_t = torch.from_numpy(rows)
            for opt in opts:
                for group in opt.param_groups:
                    group["lr"] = config.lr * (1.0 - step / total_steps)
            logits = model(batch_ids, batch_off)  # (B,)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y_t[rows_t], weight=w_t[rows_t])
            if config.l2 > 0:  # L2 on the embedding rows this batch uses (lazy, sparse) and on the linear layer
                loss = loss + config.l2 * (
                    torch.nn.functional.embedding(batch_ids, model.embedding.weight, sparse=True).pow(2).sum()
                    / len(rows)
                    + model.linear.weight.pow(2).sum()
                )
            for opt in opts:
                opt.zero_grad()
            loss.backward()
            for opt in opts:
                opt.step()
            epoch_loss += loss.item() * len(rows)
            step += 1
            if bar is not None and step % 50 == 0:
                bar.advance(50)
        losses.append(round(epoch_loss / n, 5))
        if log and (epoch + 1) % max(1, epochs // 5) == 0:
            log(f"filter: epoch {epoch + 1}/{epochs}: training loss {losses[-1]:.4f}")
    if bar is not None:
        bar.advance(step % 50)
    model.eval()
    every = max(1, epochs // 10)
    return model, {"epochs_run": epochs, "train_steps": total_steps,
                   "train_loss": {str(e + 1): losses[e] for e in range(epochs) if (e + 1) % every == 0 or e == 0}}


# ---------------------------------------------------------------------------------------------------------
# Metrics and reporting


def bootstrap_ci(correct: np.ndarray, seed: int, n_boot: int = 1000) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of a 0/1 vector.

    Resampling n values with replacement from a 0/1 vector with k ones draws Binomial(n, k/n) ones, so each
    replicate's mean is drawn as that: the same bootstrap distribution in O(n_boot) time and memory
    (resampling n_boot x n indices took 17 GB at 1.1M held-out captions)."""
    n = len(correct)
    if n == 0:
        return (float("nan"), float("nan"))
    means = np.random.default_rng(seed).binomial(n, float(np.mean(correct)), size=n_boot) / n  # (n_boot,)
    return (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


def heldout_metrics(p_ref: np.ndarray, p_src: np.ndarray, seed: int) -> dict:
    """Accuracy of "reference-like iff p >= 0.5" on held-out rows of both sets."""
    if len(p_ref) == 0 or len(p_src) == 0:
        return {"heldout_rows": int(len(p_ref) + len(p_src)), "accuracy": None}
    correct = np.concatenate([p_ref >= 0.5, p_src < 0.5]).astype(np.float64)
    n = len(correct)
    rec_r, rec_s = float((p_ref >= 0.5).mean()), float((p_src < 0.5).mean())
    return {
        "heldout_rows": n,
        "heldout_reference_rows": int(len(p_ref)),
        "heldout_source_rows": int(len(p_src)),
        "accuracy": round(float(correct.mean()), 4),
        "accuracy_ci95": [round(x, 4) for x in bootstrap_ci(correct, seed)],
        "chance_accuracy": round(max(len(p_ref), len(p_src)) / n, 4),  # always answering the larger set
        "balanced_accuracy": round((rec_r + rec_s) / 2, 4),  # chance 0.5
        "reference_called_reference_like": round(rec_r, 4),
        "source_called_source_like": round(rec_s, 4),
    }


def top_ngrams(scorer: Scorer, texts: Sequence[str], k: int = 10, min_count: int = 3) -> dict:
    """The n-grams pushing `texts` most towards each class: ranked by weight x count (their total pull
    on the scores), among n-grams seen >= min_count times. A bucket can hold several n-grams (hashing);
    the most frequent one names it."""
    counts: Counter = Counter()
    for text in texts:
        toks = tokenize_one(text)
        for n in range(1, scorer.ngrams + 1):
            counts.update(" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1))
    by_bucket: dict[int, tuple[str, int]] = {}
    for gram, c in counts.items():
        if c < min_count:
            continue
        b = featurize_one(gram, scorer.buckets, len(gram.split()))[-1]  # the full n-gram's bucket
        if b not in by_bucket or c > by_bucket[b][1]:
            by_bucket[b] = (gram, c)
    items = sorted(((float(scorer.table[b]) * c, float(scorer.table[b]), g) for b, (g, c) in by_bucket.items()),
                   reverse=True)
    return {
        "reference_like": [[g, round(w, 3)] for _, w, g in items[:k] if w > 0],
        "source_like": [[g, round(w, 3)] for _, w, g in items[::-1][:k] if w < 0],
    }


def _is_text(feature) -> bool:
    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _text_column(ds, name: str, what: str, allow_list: bool):
    """The column as an Arrow string array (a list column flattened when allowed)."""
    require_columns(ds, [name], what)
    feature = ds.features[name]
    arr = ds.data.column(name)
    if ds._indices is not None:
        arr = arr.take(ds._indices.column(0))
    if _is_text(feature):
        return arr
    if allow_list and _is_text(getattr(feature, "feature", None)):  # List / Sequence of strings
        return pa.chunked_array([pc.list_flatten(c) for c in arr.chunks], type=arr.type.value_type)
    kinds = "a text column or a list of texts" if allow_list else "a text column (one string per row)"
    raise UsageError(f"{what}: column {name!r} is not {kinds} (its type is {feature})")


def _examples(ids, texts, scores: np.ndarray, rows: np.ndarray, k: int, seed: int) -> list[dict]:
    """k of `rows` drawn at random (seeded), in row order; ids and texts: Arrow columns (only the drawn
    rows become Python objects)."""
    if k == 0 or len(rows) == 0:
        return []
    pick = pa.array(np.sort(np.random.default_rng(seed).choice(rows, size=min(k, len(rows)), replace=False)))
    return [{"id": i, "caption": t, "quality_score": round(float(scores[r]), 4)}
            for i, t, r in zip(ids.take(pick).to_pylist(), texts.take(pick).to_pylist(), pick.to_pylist())]


@dataclass
class CrossFit:
    """What cross-fitting gives: every source row's score from a classifier that did not train on it, the
    held-out scores of both sets, and each classifier's statistics."""

    scores: np.ndarray  # (n_src,) float64 quality scores
    held_ref: list  # per classifier, the scores of its held-out reference rows
    held_src: list  # per classifier, the scores of its held-out source rows
    scorers: list  # per classifier, its Scorer
    fold_stats: list  # per classifier, its training statistics
    part_s: np.ndarray  # (n_src,) each source row's part
    train_s: float = 0.0  # seconds training
    score_s: float = 0.0  # seconds scoring the source rows

    def mean_scorer(self, config: FilterConfig) -> Scorer:
        """The classifiers' mean (names the n-grams that pull towards each set)."""
        return Scorer(np.mean([x.table for x in self.scorers], axis=0), np.max([x.seen for x in self.scorers], axis=0),
                      float(np.mean([x.bias for x in self.scorers])), config.buckets, config.ngrams)


def filter_dataset(ds, ref_texts, config: FilterConfig, *, log=None) -> tuple[object, dict]:
    """Train on `ref_texts` vs `ds[config.text_column]`, score every row of `ds`, keep the reference-like ones.

    Returns the kept rows with a `quality_score` column, and the statistics.
    Stages: caption_sets -> cross_fit -> select_rows -> filter_stats -> with_scores.
    """
    config.validate()
    src_arr, ref_arr, texted = caption_sets(ds, ref_texts, config)
    fit = cross_fit(src_arr, ref_arr, config, log)
    keep, cutoff = select_rows(fit.scores, config)
    ids = arrow_column(ds, C.ID)
    if texted is not None:  # the rows without text: never scored, never kept
        ids = ids.take(pa.array(texted, type=pa.int64()))
    stats = filter_stats(ds, src_arr, ref_arr, fit, keep, cutoff, config, ids=ids)
    scores = fit.scores
    if texted is not None:
        stats["rows_in"], stats["rows_dropped"] = len(ds), len(ds) - stats["rows_out"]
        stats["kept_frac"] = round(stats["rows_out"] / len(ds), 4)
        scores, kept = np.full(len(ds), np.nan), np.zeros(len(ds), dtype=bool)
        scores[texted], kept[texted] = fit.scores, keep
        keep = kept
    stats["rows_without_text"] = 0 if texted is None else len(ds) - len(texted)
    return with_scores(ds, scores, keep), stats


def caption_sets(ds, ref_texts, config: FilterConfig) -> tuple[pa.ChunkedArray, pa.ChunkedArray, np.ndarray | None]:
    """The source captions (`ds`'s text column) and the reference captions as Arrow strings, each set
    without its texts that are None, empty or whitespace (left out with a warning: docs/conventions.md,
    "No text is no text"), and the rows of `ds` that have text (None when every row has); each set needs 2."""
    require_columns(ds, [C.ID, config.text_column], "the input")
    src_arr = _text_column(ds, config.text_column, "the input", allow_list=False)
    ref_arr = ref_texts if isinstance(ref_texts, pa.ChunkedArray) else _as_arrow(ref_texts)
    texted = None
    has = has_text(src_arr, lists=False)
    if not has.all():
        warn(missing_text_warning(int((~has).sum()), len(has), config.text_column))
        texted = np.flatnonzero(has)
        src_arr = src_arr.filter(pa.array(has))
    has = has_text(ref_arr, lists=False)
    if not has.all():
        warn(f"{int((~has).sum())} of {len(has)} reference captions have no text (empty, whitespace or missing); they are left out")
        ref_arr = ref_arr.filter(pa.array(has))
    problems = []
    for name, n in (("the input", len(src_arr)), ("the reference set", len(ref_arr))):
        if n < 2:
            problems.append(f"{name} has {n} caption(s); the classifier needs at least 2 in each set")
    if problems:
        raise UsageError("; ".join(problems))
    return src_arr, ref_arr, texted


def assign_parts(n: int, parts: int, seed: int, salt: int) -> np.ndarray:
    """Each of n rows' part (n,), 0..parts-1 in equal shares, at random (seeded)."""
    part = np.empty(n, dtype=np.int64)
    part[np.random.default_rng([seed, salt]).permutation(n)] = np.arange(n) % parts
    return part


def cross_fit(src_arr: pa.ChunkedArray, ref_arr: pa.ChunkedArray, config: FilterConfig, log) -> CrossFit:
    """Each set is cut into random parts; classifier f trains on every part but part f of both sets and
    scores part f (cross-fitting), so no row is scored by a classifier that saw it. With folds=1, one
    classifier trains on 4 of 5 parts and scores every source row (its training rows in-sample)."""
    n_src, n_ref = len(src_arr), len(ref_arr)
    parts = config.folds if config.folds > 1 else 5
    part_s, part_r = assign_parts(n_src, parts, config.seed, 0), assign_parts(n_ref, parts, config.seed, 1)
    # every caption featurized once, reference rows first, for every classifier's training and scoring
    both = pa.chunked_array([*ref_arr.cast(src_arr.type).chunks, *src_arr.chunks], type=src_arr.type)
    feats = Features.of(both, config.buckets, config.ngrams)
    del both
    fit = CrossFit(np.empty(n_src, dtype=np.float64), [], [], [], [], part_s)
    steps = sum(training_steps(int((part_s != f).sum() + (part_r != f).sum()), config) for f in range(config.folds))
    bar = Bar("filter: training", steps, unit="steps", enabled=log is not None)
    for f in range(config.folds):
        fit_fold(f, feats, part_r, fit, n_ref, config, log, bar)
    bar.close()
    return fit


def fit_fold(f: int, feats: Features, part_r: np.ndarray, fit: CrossFit, n_ref: int, config: FilterConfig, log, bar) -> None:
    """Classifier f: train it on the rows outside part f of both sets, score part f (with folds=1, every
    source row), and add its scores and statistics to `fit`. Feature rows: the reference set's, then the source's."""
    part_s, scores = fit.part_s, fit.scores
    tr_s, ho_s = np.flatnonzero(part_s != f), np.flatnonzero(part_s == f)
    tr_r, ho_r = np.flatnonzero(part_r != f), np.flatnonzero(part_r == f)
    t0 = time.perf_counter()
    clf, st = train_on_rows(feats, tr_r, tr_s + n_ref, config, bar=bar)
    fit.train_s += time.perf_counter() - t0
    if log:
        log(f"filter: classifier {f + 1}/{config.folds}: trained on {len(tr_s):,} source and {len(tr_r):,} "
            f"reference captions ({st['train_steps']} steps, final loss {list(st['train_loss'].values())[-1]:.4f})")
    scorer = Scorer.from_classifier(clf)
    del clf
    t0 = time.perf_counter()
    if config.folds > 1:
        scores[ho_s] = scorer.row_scores(feats, ho_s + n_ref)
    else:
        scores[:] = scorer.row_scores(feats, np.arange(n_ref, n_ref + len(scores)))
    fit.score_s += time.perf_counter() - t0
    fit.held_src.append(scores[ho_s])
    fit.held_ref.append(scorer.row_scores(feats, ho_r))
    fit.scorers.append(scorer)
    fit.fold_stats.append({"train_source_rows": int(len(tr_s)), "train_reference_captions": int(len(tr_r)), **st})


def select_rows(scores: np.ndarray, config: FilterConfig) -> tuple[np.ndarray, float | None]:
    """The rows kept (n,) bool and the score cutoff: the --keep-frac highest scores, else those >= --threshold."""
    if config.keep_frac is not None:
        k = int(round(config.keep_frac * len(scores)))
        order = np.argsort(-scores, kind="stable")  # highest first; ties keep row order
        keep = np.zeros(len(scores), dtype=bool)
        keep[order[:k]] = True
        return keep, (float(scores[order[k - 1]]) if k else None)
    cutoff = config.resolved_threshold
    return scores >= cutoff, cutoff


def filter_stats(ds, src_arr: pa.ChunkedArray, ref_arr: pa.ChunkedArray, fit: CrossFit, keep: np.ndarray, cutoff: float | None,
                 config: FilterConfig, ids=None) -> dict:
    """The statistics: rows kept, the rule, the classifiers, held-out accuracy, score quantiles, examples
    of kept and dropped rows, and the n-grams that pull towards each set."""
    n_src, scores = len(src_arr), fit.scores
    metrics = heldout_metrics(np.concatenate(fit.held_ref), np.concatenate(fit.held_src), config.seed)
    train_rows = np.flatnonzero(fit.part_s != 0)
    kept_rows, dropped_rows = np.flatnonzero(keep), np.flatnonzero(~keep)
    ids = arrow_column(ds, C.ID) if ids is None else ids  # (the id of each row of src_arr)
    return {
        "rows_in": n_src,
        "rows_out": int(keep.sum()),
        "rows_dropped": int((~keep).sum()),
        "kept_frac": round(float(keep.mean()), 4),
        "rule": f"keep-frac {config.keep_frac}" if config.keep_frac is not None else f"quality_score >= {cutoff}",
        "score_cutoff": None if cutoff is None else round(cutoff, 6),
        "reference_captions": len(ref_arr),
        "train_source_rows": fit.fold_stats[0]["train_source_rows"],
        "train_reference_captions": fit.fold_stats[0]["train_reference_captions"],
        "classifier": {
            "model": "fastText-style: mean of hashed n-gram embeddings -> linear -> sigmoid (PyTorch)",
            "scoring": f"cross-fitted: {config.folds} classifiers, each scores the rows it did not train on"
            if config.folds > 1 else "one classifier trained on 80% of each set scores every row (in-sample for those)",
            "ngrams": config.ngrams,
            "buckets": config.buckets,
            "dim": config.dim,
            "l2": config.l2,
            "class_weighting": "balanced (each set weighs half of the loss)",
            "per_classifier": fit.fold_stats,
            "train_seconds": round(fit.train_s, 3),
        },
        "heldout": metrics,
        "score_quantiles": {
            q: round(float(np.quantile(scores, float(q))), 4) for q in ("0.05", "0.25", "0.5", "0.75", "0.95")
        },
        "score_seconds": round(fit.score_s, 4),
        "captions_scored_per_second": round(n_src / fit.score_s) if fit.score_s > 0 else None,
        "examples_kept": _examples(ids, src_arr, scores, kept_rows, config.num_examples, config.seed),
        "examples_dropped": _examples(ids, src_arr, scores, dropped_rows, config.num_examples, config.seed + 1),
        "top_ngrams": top_ngrams(fit.mean_scorer(config), src_arr.take(pa.array(train_rows[:20000], type=pa.int64())).to_pylist()
                                 + ref_arr.slice(0, 20000).to_pylist()),
    }


def with_scores(ds, scores: np.ndarray, keep: np.ndarray):
    """The output: the input's table with the scores beside it and the kept rows as an indices mapping
    (vltool.derived): flattening a selection and add_column copied every column, images included."""
    scored = InMemoryTable(pa.table({C.QUALITY_SCORE: pa.array(scores.astype(np.float32))}))
    order = [c for c in ds.column_names if c != C.QUALITY_SCORE] + [C.QUALITY_SCORE]  # a second filter replaces the first one's scores
    fingerprint = hashlib.blake2b(b"filter\x00" + ds._fingerprint.encode() + scores.tobytes() + keep.tobytes(), digest_size=16).hexdigest()
    return with_columns(ds, scored, {C.QUALITY_SCORE: datasets.Value("float32")}, keep, order=order,
                        fingerprint=fingerprint, spill=None, chunk=1 << 20)


def filter(  # noqa: A001 - the command's name (docs/conventions.md: one name everywhere)
    data: str,
    reference: str,
    out,
    config: FilterConfig,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    reference_where: Sequence[str] = (),
    reference_split: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Load `data` and `reference`, filter `data`, write it atomically to `out`; return its `vltool.json`."""
    timer = provenance.Timer()
    config.validate()
    src = load_dataset(data, split=split, where=where, required=[C.ID], texts=[config.text_column])
    ref_column = config.reference_column or config.text_column
    ref = load_dataset(reference, split=reference_split, where=reference_where, texts=[ref_column], text_lists=True,
                       text_option="--reference-column", split_option="--reference-split")
    test_only_inputs([ref], "reference (its style chooses the rows kept, which are then trained on)", config.allow_test_data)
    require_texts(int(has_text(arrow_column(src.dataset, config.text_column), lists=False).sum()), src.rows, config.text_column, data)
    out = check_output(out, overwrite, inputs=[*src.reads, *ref.reads])
    ref_texts = _text_column(ref.dataset, ref_column, "the reference set", allow_list=True)
    require_texts(int(has_text(ref_texts, lists=False).sum()), ref.rows, ref_column, reference)
    log(f"filter: {src.rows:,} source rows, {len(ref_texts):,} reference captions; training the classifier")
    ds, stats = filter_dataset(src.dataset, ref_texts, config, log=log)
    options = {**provenance.jsonable(config), "resolved_threshold": config.resolved_threshold,
               "reference_where": list(reference_where), "reference_split": reference_split}
    prov = provenance.make(
        "filter", options, [src, ref], rows_in=stats["rows_in"], rows_out=stats["rows_out"], stats=stats, timer=timer
    )
    save_dataset(ds, out, prov, overwrite=overwrite)
    prov["wall_time_s"] = round(timer.seconds, 3)
    return prov
