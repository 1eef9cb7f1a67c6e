"""`vltool pseudolabel`: pseudo bag-of-words captions for unaligned images ("A Fistful of Words", 2.3).

For each unaligned image, `crops` augmented views each retrieve their `neighbors` nearest intact
aligned captions; NN_i is the multiset of all retrieved captions (a caption found by 3 views counts 3
times). The words of NN_i (tokenised as `deform` does: lower-cased, stop words and non-alphabetic
tokens removed) are ranked by a strategy and the top `words` become the pseudo caption.

Strategies (section 2.3, Table 7):
- `maxcount`: count(w, NN_i), the number of captions in NN_i containing w;
- `rmtop-maxcount`: maxcount after removing the `top_t` most frequent words of the aligned captions;
- `rmtop-rand`: a random order (seeded per row) after that removal;
- `weighted-count` (default): count(w, NN_i) / count(w, S_a), S_a the aligned captions.

Ties: by score (descending), then count(w, NN_i) (descending), then the word (alphabetical). The
"most frequent words" of the aligned captions are counted as `deform`'s RmTopFreq counts them (the
number of captions containing the word, over every alphabetic token, ties alphabetical).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import datasets
import faiss
import numpy as np
import torch

from vltool import columns as C
from vltool import provenance
from vltool.cache import CacheKey, EmbeddingCache, ids_digest, row_filter
from vltool.checks import clean_texts, missing_text_warning, require_decoded, require_unique_ids, text_column
from vltool.deform import row_seed
from vltool.encode import decode_image, encode_texts, image_preprocessing, load_eval_model, model_record, require_finite, run_batches
from vltool.errors import UsageError
from vltool.io.atomic import save_dataset
from vltool.io.digests import arrow_column, shared_ids
from vltool.io.heldout import test_only_inputs
from vltool.io.loading import load_dataset, LoadedDataset
from vltool.io.outputs import check_output, model_inputs
from vltool.text import english_stopwords, tokenize
from vltool.topology import computes, warn

STRATEGIES = ("maxcount", "rmtop-maxcount", "rmtop-rand", "weighted-count")


def content_words(text: str, stopwords: frozenset[str]) -> frozenset[str]:
    """The distinct words of a caption, as deform's RmStopNalpha keeps them."""
    return frozenset(t for t in tokenize(text or "") if t.isalpha() and t not in stopwords)


@dataclass
class AlignedWords:
    """What pseudolabel needs from the aligned captions, fitted on them only."""

    words: list[frozenset[str]]  # per aligned caption, its content words
    doc_freq: Counter  # count(w, S_a): aligned captions containing w (content words)
    top: frozenset[str]  # the top_t most frequent alphabetic words of the aligned captions

    @classmethod
    def fit(cls, captions: Sequence[str], top_t: int, stopwords: frozenset[str] | None = None) -> "AlignedWords":
        stop = stopwords if stopwords is not None else english_stopwords().words
        words, df, df_all = [], Counter(), Counter()
        for c in captions:
            toks = set(tokenize(c or ""))
            df_all.update(t for t in toks if t.isalpha())
            w = frozenset(t for t in toks if t.isalpha() and t not in stop)
            words.append(w)
            df.update(w)
        top = [w for w, _ in sorted(df_all.items(), key=lambda kv: (-kv[1], kv[0]))[:top_t]]
        return cls(words, df, frozenset(top))


def rank_words(
    neighbours: Sequence[int], aligned: AlignedWords, strategy: str = "weighted-count", rng: random.Random | None = None
) -> list[tuple[str, float]]:
    """Rank the words of NN_i (aligned caption indices, with repeats) by `strategy`: [(word, score), ...]."""
    if strategy not in STRATEGIES:
        raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    count: Counter = Counter()
    for j in neighbours:
        count.update(aligned.words[j])
    if strategy.startswith("rmtop"):  # weighted-count ranks frequent words lower instead of removing them
        for w in aligned.top:
            count.pop(w, None)
    if strategy == "rmtop-rand":
        rng = rng or random.Random(0)
        words = sorted(count)  # a fixed order before shuffling, so the seed decides
        rng.shuffle(words)
        return [(w, float(len(words) - r)) for r, w in enumerate(words)]
    if strategy == "weighted-count":
        scored = [(w, c / aligned.doc_freq[w], c) for w, c in count.items()]
    else:
        scored = [(w, float(c), c) for w, c in count.items()]
    scored.sort(key=lambda x: (-x[1], -x[2], x[0]))
    return [(w, s) for w, s, _ in scored]


# ----------------------------------------------------------------------------------------------------
# The command: crops -> nearest aligned captions -> ranked words -> pseudo captions
# ----------------------------------------------------------------------------------------------------

PSEUDO_WORDS = "pseudo_words"  # list of {word, score}, best first
IS_PSEUDO = "is_pseudo"
CROP_SCALE = (0.25, 1.0)  # vltool's choice: the paper does not give its crop parameters
CROP_RATIO = (3 / 4, 4 / 3)


@dataclass
class PseudolabelConfig:
    """Options of `vltool pseudolabel`, one field per option of the same name (help: `vltool pseudolabel --help`)."""

    model: str = ""
    pretrained: str | None = None
    crops: int = 5  # vltool's choice
    neighbors: int = 10
    strategy: str = "weighted-count"  # the paper's best
    top_t: int = 1000
    words: int = 4
    batch_size: int = 32
    cache_dir: str | None = None
    seed: int = 0
    allow_test_data: bool = False  # the aligned data may be built-in test-only data (io.test_only_inputs)
    device: str = "auto"  # auto | cpu | cuda (vltool.topology.compute_scope)
    threads: int | None = None  # torch's intra-op threads (None: torch's own)

    def validate(self) -> None:
        problems = []
        if not str(self.model or "").strip():
            problems.append("--model is required (a vltool RUN_DIR, hf:ORG/NAME or hf:DIR, open_clip:ARCH/TAG, open_clip:hf-hub:ORG/NAME, or local-dir:PATH)")
        if self.strategy not in STRATEGIES:
            problems.append(f"--strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        for name in ("crops", "neighbors", "words", "batch_size"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1")
        if self.top_t < 0:
            problems.append("--top-t must be >= 0")
        if self.threads is not None and self.threads < 1:
            problems.append(f"--threads must be >= 1, got {self.threads}")
        if problems:
            raise UsageError("; ".join(problems))


def agreement_with_withheld(pseudo: list[str], truth: list[frozenset[str]], seed: int, permutations: int = 100) -> dict:
    """How often a pseudo caption shares a word with the image's own withheld caption, against the same
    pseudo captions given to shuffled images (the permutation baseline, mean over seeded permutations)."""
    words = [set(p.split()) for p in pseudo]
    hit = np.array([bool(w & t) for w, t in zip(words, truth)], dtype=float)
    rng = np.random.default_rng(seed)
    base = [np.mean([bool(words[j] & t) for j, t in zip(rng.permutation(len(words)), truth)]) for _ in range(permutations)]
    return {
        "rows": len(words),
        "share_with_a_true_word": round(float(hit.mean()), 4),
        "permutation_baseline": round(float(np.mean(base)), 4),
        "permutation_baseline_95th": round(float(np.quantile(base, 0.95)), 4),
        "permutations": permutations,
    }


def crop_box(width: int, height: int, rng) -> tuple[int, int, int, int]:
    """A random resized crop's box (left, top, right, bottom), as torchvision's RandomResizedCrop draws it."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*CROP_SCALE)
        log_r = (math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1]))
        ratio = math.exp(rng.uniform(*log_r))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            left = int(rng.integers(0, width - w + 1))
            top = int(rng.integers(0, height - h + 1))
            return left, top, left + w, top + h
    return 0, 0, width, height  # fallback: the whole image


def view_seed(seed: int, row_id: str) -> int:
    return row_seed(seed, f"pseudolabel:{row_id}")


def encode_views(m, src, config: PseudolabelConfig, cache) -> tuple[np.ndarray, np.ndarray]:
    """(N, crops, D) embeddings of seeded random crops of every image, and the (N,) mask of bad images."""
    ds = src.dataset
    raw = ds.select_columns([C.IMAGE])
    if isinstance(raw.features[C.IMAGE], datasets.Image):
        raw = raw.cast_column(C.IMAGE, datasets.Image(decode=False))
    ids = ds[C.ID]
    n, c = len(ds), config.crops
    prep = image_preprocessing(m) | {"crops": c, "crop_scale": CROP_SCALE, "crop_ratio": CROP_RATIO, "seed": config.seed}
    key = CacheKey(model=m.fingerprint, dataset=src.fingerprint, rows=row_filter(src.split, src.where), column=C.IMAGE, preprocessing=prep)
    digest = ids_digest(ids)
    if cache is not None:
        hit = cache.get(key, rows=n, ids=digest)
        if hit is not None:
            d = hit.shape[1] // c
            emb = hit.reshape(n, c, d)
            return emb, np.isnan(emb).any(axis=(1, 2))
    size = m.config.get("preprocess", {}).get("size", 224)
    hw = (int(size), int(size)) if isinstance(size, (int, float)) else tuple(int(x) for x in size)  # (open_clip: an int or (H, W))

    def prepare(a: int, b: int):
        xs = []
        for j, v in enumerate(raw[a:b][C.IMAGE]):
            # in its own mode: the model's transform converts it as its library does (as zeroshot and training)
            im = decode_image(v, rgb=False) if isinstance(v, dict) or v is None else v
            if im is None:
                xs.extend([torch.full((3, *hw), float("nan"))] * c)
                continue
            rng = np.random.default_rng(view_seed(config.seed, ids[a + j]))
            for _ in range(c):
                xs.append(m.preprocess(im.crop(crop_box(im.width, im.height, rng))))
        return torch.stack(xs)  # (B*c, 3, H, W)

    def forward(x):
        bad = torch.isnan(x).flatten(1).any(1)  # (B*c,)
        out = m.encode_image(torch.nan_to_num(x)).float().cpu()  # (B*c, D)
        require_finite(out.numpy(), m, "image", bad=bad.numpy(), what="image crops")
        out[bad] = float("nan")
        return out.reshape(-1, c * out.shape[1])  # (B, c*D)

    with torch.inference_mode():
        flat = run_batches(n, config.batch_size, prepare, forward, label=f"encoding {n:,} images x {c} crops")
    if cache is not None:
        cache.put(key, flat, ids=digest, extra={"spec": src.spec})
    emb = flat.reshape(n, c, -1)
    return emb, np.isnan(emb).any(axis=(1, 2))


@dataclass
class PseudoCaptions:
    """The pseudo-captions of the unaligned rows that got words."""

    keep: list[int]  # the unaligned rows kept (their image decoded and they got at least one word)
    pseudo: list[str]  # per kept row, its words joined by spaces
    scored: list[list[dict]]  # per kept row, [{"word", "score"}] in rank order
    empty_ids: list[str]  # ids of the rows that got no word
    words_fit: AlignedWords


@computes
def pseudolabel(
    unaligned: str,
    aligned: str,
    out,
    config: PseudolabelConfig,
    *,
    where=(),
    split=None,
    aligned_where=(),
    aligned_split=None,
    overwrite: bool = False,
) -> dict:
    """Pseudo bag-of-words captions for the images of `unaligned` from the captions of `aligned`.

    Stages: load_inputs -> encode (aligned captions; encode_views of the unaligned images) ->
    nearest_captions -> pseudo_captions -> withheld_check -> output_dataset -> pseudolabel_stats -> save.
    """
    timer = provenance.Timer()
    config.validate()
    usrc, asrc, text_col, out = load_inputs(unaligned, aligned, out, config, where, split, aligned_where, aligned_split, overwrite)

    m = load_eval_model(config.model, config.pretrained, config.cache_dir)
    cache = EmbeddingCache(config.cache_dir)
    captions = clean_texts(asrc.dataset[text_col])
    txt = encode_texts(m, asrc, column=text_col, cache=cache)  # (empty captions are left out)
    no_text = missing_text_warning(sum(c_ is None for c_ in captions), len(captions), text_col)
    if no_text:
        warn(no_text)
    views, bad = encode_views(m, usrc, config, cache)  # (N, c, D), (N,)
    require_decoded(bad, unaligned)

    nn_rows = nearest_captions(views, txt, config.neighbors)  # (N, c*k)
    ids = usrc.dataset[C.ID]
    made = pseudo_captions(nn_rows, bad, ids, captions, config)
    check = withheld_check(usrc.dataset, made, config.seed)
    ds = output_dataset(usrc.dataset, made)
    stats = pseudolabel_stats(made, ids, len(views), bad, captions, text_col, check, config)
    prov = provenance.make("pseudolabel", config, [usrc, asrc], rows_in=len(views), rows_out=len(made.keep), stats=stats, timer=timer)
    prov["model"] = model_record(m, config.model, config.pretrained)
    save_dataset(ds, out, prov, overwrite=overwrite)
    return prov


def load_inputs(unaligned: str, aligned: str, out, config: PseudolabelConfig, where, split, aligned_where, aligned_split,
                overwrite: bool) -> tuple[LoadedDataset, LoadedDataset, str, Path]:
    """Load both sets and check them before any work: the aligned caption column (caption_original, else
    caption), no image in both sets, --out, and rows in both."""
    usrc = load_dataset(unaligned, split=split, where=where, required=[C.ID], images=[C.IMAGE], cache_dir=config.cache_dir)
    asrc = load_dataset(aligned, split=aligned_split, where=aligned_where, required=[C.ID], cache_dir=config.cache_dir,
                        split_option="--aligned-split")
    test_only_inputs([asrc], "aligned input (its captions label the unaligned images, which are then trained on)", config.allow_test_data)
    text_col = C.CAPTION_ORIGINAL if C.CAPTION_ORIGINAL in asrc.dataset.column_names else C.CAPTION
    if text_col not in asrc.dataset.column_names:
        raise UsageError(f"the aligned data {aligned!r} has no caption column (it has: {', '.join(asrc.dataset.column_names)})")
    text_column(asrc.dataset, text_col, aligned, option="the aligned caption column")
    require_unique_ids(arrow_column(usrc.dataset, C.ID), unaligned)  # ids name the rows: in the output, and
    require_unique_ids(arrow_column(asrc.dataset, C.ID), aligned)  # in the check that no image is in both sets
    overlap = shared_ids(usrc.dataset, asrc.dataset)
    if overlap:
        raise UsageError(f"{len(overlap)} ids are in both the unaligned and the aligned data (e.g. {overlap[0]!r}); "
                         "an image cannot be both")
    out = check_output(out, overwrite, inputs=[*usrc.reads, *asrc.reads, *model_inputs(config.model, config.pretrained)])
    if len(asrc.dataset) == 0 or len(usrc.dataset) == 0:
        raise UsageError("the unaligned and the aligned data both need rows after their filters")
    return usrc, asrc, text_col, out


def nearest_captions(views: np.ndarray, txt, neighbors: int) -> np.ndarray:
    """The aligned row of each of the `neighbors` captions nearest to every view, over the whole aligned
    set (cosine, exact): (N, c*k) from the views (N, c, D) and the encoded captions."""
    n, c, d = views.shape
    index = faiss.IndexFlatIP(d)
    t = txt.embeddings.astype(np.float32)  # (T, D)
    index.add(t / np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12))
    q = np.nan_to_num(views.reshape(n * c, d)).astype(np.float32)  # (N*c, D)
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    k = min(neighbors, len(t))
    _, nn = index.search(q, k)  # (N*c, k) caption indices (text rows map to aligned rows via owner)
    return txt.owner[nn].reshape(n, c * k)  # (N, c*k) aligned row of each retrieved caption


def pseudo_captions(nn_rows: np.ndarray, bad: np.ndarray, ids: list[str], captions: list, config: PseudolabelConfig) -> PseudoCaptions:
    """Each decoded unaligned image's words: the aligned words its retrieved captions vote for (rank_words
    with --strategy), at most --words of them; a row that gets none is dropped."""
    words_fit = AlignedWords.fit(captions, config.top_t)
    made = PseudoCaptions([], [], [], [], words_fit)
    for i in range(len(nn_rows)):
        if bad[i]:
            continue
        rng = random.Random(view_seed(config.seed, ids[i])) if config.strategy == "rmtop-rand" else None
        ranked = rank_words(nn_rows[i].tolist(), words_fit, config.strategy, rng)[: config.words]
        if not ranked:
            made.empty_ids.append(ids[i])
            continue
        made.keep.append(i)
        made.pseudo.append(" ".join(w for w, _ in ranked))
        made.scored.append([{"word": w, "score": float(s)} for w, s in ranked])
    return made


def withheld_check(ds, made: PseudoCaptions, seed: int) -> dict | None:
    """How the pseudo-captions agree with the unaligned rows' own (withheld) captions, when they have them."""
    if C.CAPTION not in ds.column_names or not made.keep:
        return None
    truth = [content_words(t if isinstance(t, str) else "", english_stopwords().words) for t in ds.select(made.keep)[C.CAPTION]]
    return agreement_with_withheld(made.pseudo, truth, seed)


def output_dataset(ds, made: PseudoCaptions):
    """The kept unaligned rows, their own texts removed, with caption, pseudo_words and is_pseudo."""
    ds = ds.select(made.keep)
    withheld = [col for col in (C.CAPTION, C.CAPTIONS, C.CAPTION_ORIGINAL, C.IS_BASE, PSEUDO_WORDS, IS_PSEUDO) if col in ds.column_names]
    ds = ds.remove_columns(withheld)  # an unaligned image's own texts never reach the output
    ds = ds.add_column(C.CAPTION, made.pseudo, feature=datasets.Value("string"))
    ds = ds.add_column(PSEUDO_WORDS, made.scored, feature=datasets.List({"word": datasets.Value("string"), "score": datasets.Value("float32")}))
    return ds.add_column(IS_PSEUDO, [True] * len(made.keep), feature=datasets.Value("bool"))


def pseudolabel_stats(made: PseudoCaptions, ids: list[str], n: int, bad: np.ndarray, captions: list, text_col: str, check: dict | None,
                      config: PseudolabelConfig) -> dict:
    """The record's "stats": rows kept and dropped, words per caption, the commonest words, examples, the check."""
    pseudo, keep = made.pseudo, made.keep
    lengths = [len(p.split()) for p in pseudo]
    freq = Counter(w for p in pseudo for w in p.split())
    return {
        "rows_in": n,
        "rows_out": len(keep),
        "bad_images": int(bad.sum()),
        "dropped_no_words": len(made.empty_ids),
        "dropped_ids": made.empty_ids[:50],
        "aligned_rows": len(captions),
        "aligned_text_column": text_col,
        "words_per_caption": round(sum(lengths) / len(lengths), 3) if lengths else 0.0,
        "top_pseudo_words": [[w, c_] for w, c_ in freq.most_common(20)],
        "examples": [{"id": ids[i], "caption": p} for i, p in zip(keep[:8], pseudo[:8])],
        "removed_top_words": len(made.words_fit.top) if config.strategy.startswith("rmtop") else 0,
        "crop": {"scale": CROP_SCALE, "ratio": CROP_RATIO},
        "stopwords": english_stopwords().source,
        "stopwords_sha256": english_stopwords().sha256,
        "withheld_caption_check": check,
    }
