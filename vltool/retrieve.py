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

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from vltool import columns as C
from vltool.errors import UsageError, check
from vltool.evaluation import EvalCommon
from vltool.metrics import RetrievalItems  # (defined in vltool.metrics; still importable from here)

DIRECTIONS = ("image_to_text", "text_to_image")


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

    text_column: str = C.CAPTION
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


def retrieval_chance_levels(ks: Sequence[int], n_images: int, n_texts: int, per_image: np.ndarray) -> dict[str, float]:
    """What a uniformly random ranking scores (per query, then averaged like the metric).

    text->image: one correct image among n_images: R@K = K / n_images, rank (n_images + 1) / 2.
    image->text: p correct texts among n_texts: R@K = 1 - C(n_texts - p, K) / C(n_texts, K), expected rank
    of the first correct one (n_texts + 1) / (p + 1).
    """
    from vltool.metrics import retrieval_chance

    out = {}
    for k in ks:
        out[f"image_to_text_R@{k}"] = float(np.mean(retrieval_chance(n_texts, per_image, k)))
    i_rank = (n_texts + 1) / (per_image + 1.0)
    out["image_to_text_mean_rank"] = float(np.mean(i_rank))
    out["image_to_text_median_rank"] = float(np.median(i_rank))
    for k in ks:
        out[f"text_to_image_R@{k}"] = min(k, n_images) / n_images
    out["text_to_image_mean_rank"] = (n_images + 1) / 2
    out["text_to_image_median_rank"] = (n_images + 1) / 2
    return out


def retrieve(
    data: str,
    config: RetrieveConfig,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    argv: Sequence[str] | None = None,
) -> dict:
    """Evaluate image-text retrieval of `config.model` on `data`; returns the results record."""
    from vltool import provenance
    from vltool.cache import EmbeddingCache
    from vltool.checks import missing_text_warning, require_decoded
    from vltool.encode import encode_device, encode_images, encode_texts, load_eval_model, model_record
    from vltool.evaluation import bootstrap_record, check_out, debias_edit, entry, finish
    from vltool.topology import process_state, warn
    from vltool.io import load_dataset
    from vltool.metrics import Resampling, bootstrap, retrieval_ranks
    from vltool.outcomes import base_arrays, example_ids, read_groups

    timer = provenance.Timer()
    ks = config.validate()
    from vltool.importer import clip_benchmark_input

    loaded = load_dataset(clip_benchmark_input(data, config.cache_dir), split=split, where=where, images=[C.IMAGE],
                          texts=[config.text_column], text_lists=True, cache_dir=config.cache_dir)
    loaded.spec = data
    out_path = check_out(out, overwrite, [*loaded.reads, Path(data).expanduser()], config)
    if loaded.rows == 0:
        raise UsageError(f"no rows of {data!r} are selected (--where {list(where)})")
    groups = read_groups(loaded.dataset, config.group_column, data)

    m = load_eval_model(config.model, config.pretrained, config.cache_dir)
    cache = EmbeddingCache(config.cache_dir)
    img = encode_images(m, loaded, cache=cache, batch_size=config.batch_size, workers=config.workers, progress=config.progress)
    txt = encode_texts(m, loaded, column=config.text_column, cache=cache, batch_size=config.text_batch_size, progress=config.progress)

    # images that cannot be decoded, or have no text, take part on neither side
    n_rows = loaded.rows
    per_row = np.bincount(txt.owner, minlength=n_rows)
    keep = ~img.bad & (per_row > 0)
    require_decoded(img.bad, data)
    if (img.bad).any():
        warn(f"{int(img.bad.sum())} images could not be decoded; they and their texts are left out")
    no_text = missing_text_warning(int((per_row == 0).sum()), n_rows, config.text_column)
    if no_text:
        warn(no_text)
    new_index = np.cumsum(keep) - 1
    t_keep = keep[txt.owner]
    images = img.embeddings if keep.all() else img.embeddings[keep]  # (a copy only when rows are left out)
    texts = txt.embeddings if t_keep.all() else txt.embeddings[t_keep]
    edit = debias_edit(m, config)
    if edit is not None:
        images, texts = edit.images(images), edit.texts(texts)
    owner = txt.owner if keep.all() else new_index[txt.owner[t_keep]]
    n_i, n_t = len(images), len(texts)
    if n_i < 2:
        raise UsageError(f"retrieval needs at least 2 images with text; {n_i} are left")

    bar = _bar(n_t, config.progress)
    try:  # the blocks of scores in torch, on the device the model encoded on (the CPU's cores or a GPU)
        i2t, t2i = retrieval_ranks(images, texts, owner, block_bytes=config.block_mb * 2**20, progress=(lambda k: bar[0].advance(bar[1], k)) if bar else None,
                                   device=encode_device())
    finally:
        if bar:
            bar[0].stop()
    bad_images, rows_without_text = int(img.bad.sum()), int(((per_row == 0) & ~img.bad).sum())
    cache_record = {"images": img.summary(), "texts": txt.summary()}
    del img, txt, images, texts  # the embeddings are done with: freed before the per-example arrays are made
    items = RetrievalItems.from_ranks(ks, i2t, t2i, owner)
    point = items.metrics()
    kept_groups = groups[keep] if groups is not None else None
    plan = Resampling.make(n_i, None, kept_groups)
    iv = bootstrap(n_i, items.metrics, config.bootstrap, config.seed, resampling=plan)
    ids = example_ids(loaded.dataset)
    examples = base_arrays("retrieval", "retrieval", ids if keep.all() else ids[keep], kept_groups, config.group_column)
    examples.update(
        i2t_greater=i2t.greater, i2t_tied=i2t.tied, i2t_tied_pos=i2t.tied_pos, text_owner=owner,
        t2i_greater=t2i.greater, t2i_tied=t2i.tied, recall_k=np.asarray(ks, dtype=np.int64),
    )
    unit = plan.unit("image", config.group_column) + (", each image with all its texts" if plan.grouped else " (with all its texts)")
    per_image = np.bincount(owner, minlength=n_i)
    chance = retrieval_chance_levels(ks, n_i, n_t, per_image)
    metrics = {k: entry(v, iv[k], chance[k]) for k, v in point.items()}
    ties = {"image_to_text_queries_with_ties": int((i2t.tied > 0).sum()), "text_to_image_queries_with_ties": int((t2i.tied > 0).sum())}

    stats = {
        "rows_evaluated": int(n_i),
        "images": int(n_i),
        "texts": int(n_t),
        "texts_per_image": {"mean": float(per_image.mean()), "min": int(per_image.min()), "max": int(per_image.max())},
        "bad_images": bad_images,
        "rows_without_text": rows_without_text,
        "processes": process_state().num_processes,
        **ties,
        "cache": cache_record,
    }
    record = provenance.make("retrieve", config, [loaded], rows_in=loaded.rows, rows_out=int(n_i), stats=stats, timer=timer, argv=argv)
    record.update({
        "task": "retrieval",
        "model": model_record(m, config.model, config.pretrained),
        "data": {
            "spec": data, "fingerprint": loaded.fingerprint, "split": loaded.split, "where": loaded.where,
            "rows": loaded.rows, "images": int(n_i), "texts": int(n_t), "text_column": config.text_column,
        },
        "protocol": {
            "recall_k": ks,
            "debias": edit.record if edit is not None else None,
            "image_to_text": "hit when any correct text is in the top K (CLIP_benchmark)",
            "text_to_image": "hit when the text's image is in the top K",
            "rank": "1-based rank of the first correct item, counted: 1 + wrong items scoring above it",
            "score": "cosine similarity of L2-normalised embeddings (float64)",
            "ties": "broken uniformly at random; metrics are the expectation (exact when no ties)",
            "chance": "a uniformly random ranking: K/N_images (text->image); mean over images of 1 - C(N_texts-p, K)/C(N_texts, K) for p correct texts (image->text)",
            "bootstrap": bootstrap_record(config.bootstrap, config.seed, unit, plan, config.group_column),
        },
        "metrics": metrics,
        "chance": chance,
    })
    record["wall_time_s"] = round(timer.seconds, 3)
    return finish(record, out_path, overwrite, examples)


def _bar(total: int, enabled: bool):
    from vltool.console import Bar
    from vltool.topology import is_main

    if not enabled or not is_main():
        return None
    bar = Bar("ranking", total, unit="texts")
    if bar.prog is None:
        return None
    return bar.prog, bar.task
