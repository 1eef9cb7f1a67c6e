"""`vltool retrieve`: image-to-text and text-to-image retrieval (CLIP_benchmark's definitions).

Every row is one image and its text(s) (`--text-column`: a string column, or a list column such as
`captions`, where every text of an image is a correct match). Image-to-text: an image is a hit at K when
any of its texts is among the K texts scoring highest with it; text-to-image: a text is a hit when its
own image is among the K images scoring highest. Mean and median rank are those of the first correct
item. Ranks are counted in blocks of scores (vltool.metrics.retrieval_ranks), never from the full
similarity matrix. Intervals resample images (with all their texts); chance is what a uniformly random
ranking scores (docs/evaluation.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from vltool import columns as C
from vltool import encode, metrics  # modules, read at call time: the tests replace encode.encode_device and metrics.retrieval_ranks
from vltool import provenance
from vltool.checks import missing_text_warning, require_decoded
from vltool.console import Bar
from vltool.errors import UsageError, VltoolError, check
from vltool.evaluation import (EvalCommon, Edit, bootstrap_record, check_out, data_record, debias_edit, encode_eval_images, entry,
                               load_eval_input, open_model, require_selected, write_results)
from vltool.metrics import QueryRanks, Resampling, bootstrap
from vltool.metrics import RetrievalItems, retrieval_chance_levels  # (defined in vltool.metrics; still importable from here)
from vltool.outcomes import base_arrays, example_ids, read_groups
from vltool.topology import computes, is_main, process_state, warn



def parse_recall_k(text: str | Sequence[int]) -> list[int]:
    if isinstance(text, str):
        try:
            ks = [int(t) for t in text.replace(" ", "").split(",") if t]
        except ValueError:
            raise UsageError(f"--recall-k {text!r}: expected integers separated by commas, e.g. 1,5,10") from None
    else:
        ks = [int(k) for k in text]
    if not ks or min(ks) < 1:
        raise UsageError(f"--recall-k {text!r}: give positive integers, e.g. 1,5,10")
    return sorted(set(ks))


@dataclass
class RetrieveConfig(EvalCommon):
    """Options of `vltool retrieve` (and, from EvalCommon, those of every evaluation command), one field per
    option of the same name (help: `vltool retrieve --help`)."""

    text_column: str | None = None  # None: captions on a CLIP_benchmark retrieval set, else caption (default_text_column)
    recall_k: str = "1,5,10"
    text_batch_size: int = 256
    block_mb: int = 64

    def validate(self) -> list[int]:
        problems = self.common_problems()
        ks: list[int] = []
        try:
            ks = parse_recall_k(self.recall_k)
        except UsageError as e:
            problems.append(str(e))
        if self.block_mb < 1:
            problems.append(f"--block-mb must be >= 1, got {self.block_mb}")
        if self.text_batch_size < 1:
            problems.append(f"--text-batch-size must be >= 1, got {self.text_batch_size}")
        check(problems)
        return ks


@dataclass
class Ranked:
    """The images and texts that took part, and the rank of each one's correct item(s) among the others."""

    keep: np.ndarray  # (N_rows,) bool: the rows whose image decoded and that have a text
    owner: np.ndarray  # (N_t,) each kept text's image among the kept ones
    i2t: QueryRanks  # (N_i,) per image: texts above / tied with its first correct text
    t2i: QueryRanks  # (N_t,) per text: images above / tied with its own image
    n_images: int
    n_texts: int
    bad_images: int
    rows_without_text: int  # rows whose image decoded and that have no text
    edit: Edit | None

    @property
    def per_image(self) -> np.ndarray:
        return np.bincount(self.owner, minlength=self.n_images)  # (N_i,) texts of each image


def default_text_column(data: str) -> str:
    """The texts a retrieval set is scored on by default: on a CLIP_benchmark retrieval set (its layout, or
    vltool's import of one) all of an image's captions (`captions`), as CLIP_benchmark and `vltool benchmark`
    score it; else `caption`."""
    from vltool.importer.clip_benchmark import clip_benchmark_layout
    from vltool.io.records import read_provenance

    root = Path(str(data)).expanduser()
    if not root.is_dir():
        return C.CAPTION
    if clip_benchmark_layout(root) is not None:
        return C.CAPTIONS
    try:
        rec = read_provenance(root)
    except VltoolError:
        rec = None  # (a damaged record: loading the data says so)
    stats = rec.get("stats") if isinstance(rec, dict) else None
    return C.CAPTIONS if isinstance(stats, dict) and stats.get("captions_column") is True else C.CAPTION


@computes
def retrieve(
    data: str,
    config: RetrieveConfig,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    argv: Sequence[str] | None = None,
    examples_out: Path | None = None,
) -> dict:
    """Evaluate image-text retrieval of `config.model` on `data`; returns the results record.

    Stages: load_eval_input -> encode (images, texts) -> rank_pairs -> score_retrieval -> write_results.
    """
    timer = provenance.Timer()
    ks = config.validate()
    if config.text_column is None:
        config = replace(config, text_column=default_text_column(data))
    loaded = load_eval_input(data, config, where, split, images=[C.IMAGE], texts=[config.text_column], text_lists=True)
    out_path = check_out(out, overwrite, [*loaded.reads, Path(data).expanduser()], config)
    require_selected(loaded, data, where)
    groups = read_groups(loaded.dataset, config.group_column, data)

    m, cache = open_model(config)
    img = encode_eval_images(m, loaded, cache, config)
    txt = encode.encode_texts(m, loaded, column=config.text_column, cache=cache, batch_size=config.text_batch_size, progress=config.progress,
                              precision=config.precision)
    ranked = rank_pairs(m, img, txt, loaded.rows, data, config)
    cache_record = {"images": img.summary(), "texts": txt.summary()}
    del img, txt  # the embeddings are done with: freed before the per-example arrays are made

    kept_groups = groups[ranked.keep] if groups is not None else None
    plan = Resampling.make(ranked.n_images, None, kept_groups)
    metric_entries, chance = score_retrieval(ranked, ks, plan, config)
    ids = example_ids(loaded.dataset)
    examples = base_arrays("retrieval", "retrieval", ids if ranked.keep.all() else ids[ranked.keep], kept_groups, config.group_column)
    examples.update(
        i2t_greater=ranked.i2t.greater, i2t_tied=ranked.i2t.tied, i2t_tied_pos=ranked.i2t.tied_pos, text_owner=ranked.owner,
        t2i_greater=ranked.t2i.greater, t2i_tied=ranked.t2i.tied, recall_k=np.asarray(ks, dtype=np.int64),
    )
    return write_results(
        "retrieve", config, [loaded], m, task="retrieval", rows_out=ranked.n_images, stats=retrieval_stats(ranked, cache_record),
        timer=timer, argv=argv,
        data=data_record(data, loaded, images=ranked.n_images, texts=ranked.n_texts, text_column=config.text_column),
        protocol=retrieval_protocol(config, ks, ranked.edit, plan),
        results={"metrics": metric_entries, "chance": chance},
        out=out_path, overwrite=overwrite, examples=examples, examples_out=examples_out,
    )


def rank_pairs(m, img, txt, n_rows: int, data: str, config: RetrieveConfig) -> Ranked:
    """Leave out the images that cannot be decoded or have no text (and their texts: they take part on
    neither side), apply --debias, and rank both ways in blocks of scores (metrics.retrieval_ranks)."""
    per_row = np.bincount(txt.owner, minlength=n_rows)  # (N_rows,) texts of each row
    keep = ~img.bad & (per_row > 0)
    require_decoded(img.bad, data)
    if (img.bad).any():
        warn(f"{int(img.bad.sum())} images could not be decoded; they and their texts are left out")
    no_text = missing_text_warning(int((per_row == 0).sum()), n_rows, config.text_column)
    if no_text:
        warn(no_text)
    new_index = np.cumsum(keep) - 1  # (N_rows,) each kept row's index among the kept ones
    t_keep = keep[txt.owner]
    images = img.embeddings if keep.all() else img.embeddings[keep]  # (N_i, D) (a copy only when rows are left out)
    texts = txt.embeddings if t_keep.all() else txt.embeddings[t_keep]  # (N_t, D)
    edit = debias_edit(m, config)
    if edit is not None:
        images, texts = edit.images(images), edit.texts(texts)
    owner = txt.owner if keep.all() else new_index[txt.owner[t_keep]]  # (N_t,)
    n_i, n_t = len(images), len(texts)
    if n_i < 2:
        raise UsageError(f"retrieval needs at least 2 images with text; {n_i} are left")

    bar = _bar(n_t, config.progress)
    try:  # the blocks of scores in torch, on the device the model encoded on (the CPU's cores or a GPU)
        i2t, t2i = metrics.retrieval_ranks(images, texts, owner, block_bytes=config.block_mb * 2**20,
                                           progress=(lambda k: bar[0].advance(bar[1], k)) if bar else None, device=encode.encode_device())
    finally:
        if bar:
            bar[0].stop()
    bad_images, rows_without_text = int(img.bad.sum()), int(((per_row == 0) & ~img.bad).sum())
    return Ranked(keep, owner, i2t, t2i, n_i, n_t, bad_images, rows_without_text, edit)


def score_retrieval(ranked: Ranked, ks: list[int], plan: Resampling, config: RetrieveConfig) -> tuple[dict, dict]:
    """vltool.metrics.RETRIEVAL_METRICS (recall at each K and the mean and median rank, both ways), with their
    intervals (images resampled with all their texts) and chance levels: (metrics, chance)."""
    items = RetrievalItems.from_ranks(ks, ranked.i2t, ranked.t2i, ranked.owner)
    point = items.metrics()
    iv = bootstrap(ranked.n_images, items.metrics, config.bootstrap, config.seed, resampling=plan)
    chance = retrieval_chance_levels(ks, ranked.n_images, ranked.n_texts, ranked.per_image)
    return {k: entry(v, iv[k], chance[k]) for k, v in point.items()}, chance


def retrieval_stats(ranked: Ranked, cache_record: dict) -> dict:
    """The record's "stats": images, texts, what was left out, ties, processes, what the cache served."""
    per_image = ranked.per_image
    return {
        "rows_evaluated": int(ranked.n_images),
        "images": int(ranked.n_images),
        "texts": int(ranked.n_texts),
        "texts_per_image": {"mean": float(per_image.mean()), "min": int(per_image.min()), "max": int(per_image.max())},
        "bad_images": ranked.bad_images,
        "rows_without_text": ranked.rows_without_text,
        "processes": process_state().num_processes,
        "image_to_text_queries_with_ties": int((ranked.i2t.tied > 0).sum()),
        "text_to_image_queries_with_ties": int((ranked.t2i.tied > 0).sum()),
        "cache": cache_record,
    }


def retrieval_protocol(config: RetrieveConfig, ks: list[int], edit: Edit | None, plan: Resampling) -> dict:
    """The record's "protocol": what a hit and a rank are, the score, ties, chance and the bootstrap."""
    unit = plan.unit("image", config.group_column) + (", each image with all its texts" if plan.grouped else " (with all its texts)")
    return {
        "recall_k": ks,
        "debias": edit.record if edit is not None else None,
        "image_to_text": "hit when any correct text is in the top K (CLIP_benchmark)",
        "text_to_image": "hit when the text's image is in the top K",
        "rank": "1-based rank of the first correct item, counted: 1 + wrong items scoring above it",
        "score": "cosine similarity of L2-normalised embeddings (float64)",
        "ties": "broken uniformly at random; metrics are the expectation (exact when no ties)",
        "chance": "a uniformly random ranking: K/N_images (text->image); mean over images of 1 - C(N_texts-p, K)/C(N_texts, K) for p correct texts (image->text)",
        "bootstrap": bootstrap_record(config.bootstrap, config.seed, unit, plan, config.group_column),
    }


def _bar(total: int, enabled: bool):
    if not enabled or not is_main():
        return None
    bar = Bar("ranking", total, unit="texts")
    if bar.prog is None:
        return None
    return bar.prog, bar.task
