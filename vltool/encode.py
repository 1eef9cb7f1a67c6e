"""Load a model to encode with, and encode a dataset's images or texts through the embedding cache (vltool.cache).

    from vltool.encode import load_eval_model, model_record, encode_images, encode_texts, encode_prompts
    m = load_eval_model(spec, pretrained, cache_dir)                # LoadedModel, or LazyModel for a RUN_DIR
    img = encode_images(m, data, cache=EmbeddingCache(cache_dir))   # Encoded: (N, D) float32 + bad mask
    txt = encode_texts(m, data, column="captions", cache=...)       # (T, D) + owner (T,) row of each text

- Batches of `batch_size` rows; the next batches are decoded and preprocessed in background threads
  while the model encodes the current one. A progress bar goes to stderr.
- Under `accelerate launch` each process encodes every world-th batch (global batch b goes to process
  b % world), the pieces are gathered and put back in row order. Every batch holds the same rows whatever
  the number of processes, so the result is the same as with one process, bit for bit.
- An image that cannot be decoded gives a NaN row and is flagged in `bad`; callers drop those rows.
- The embeddings of `features="post"` are the model's L2-normalised embeddings; `"pre"` are the image
  features before the projection (not normalised), see `image_forward`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from vltool import checks
from vltool import columns as C
from vltool.cache import CacheKey, EmbeddingCache, cant_write, row_filter, texts_digest
from vltool.checks import clean_text, image_column, nonblank, read_json, require_texts, text_column
from vltool.console import Bar
from vltool.errors import UsageError, VltoolError
from vltool.io.atomic import write_json_atomic
from vltool.io.digests import arrow_column, column_digest, strings_digest
from vltool.io.images import decode_image  # noqa: F401  (decode_image re-exported: callers import it from here)
from vltool.provenance import mark_first_batch
from vltool.topology import is_main, process_state, warn

# torch, accelerate, datasets, pyarrow and vltool.model (torch, open_clip) are imported inside the functions that
# use them, not here: `vltool --help` loads this module (through commands/mine_positives.py) and must stay fast.

FEATURES = ("post", "pre")
PROMPTS_COLUMN = "<prompts>"  # the column name in the key of a list of texts that is not a dataset column


@dataclass
class Encoded:
    """Embeddings of one column, and how they were obtained."""

    embeddings: np.ndarray  # (N, D) float32, in row order (texts: in row order, then list order)
    key: str  # the cache key (file name under <cache-dir>/embeddings/)
    hit: bool  # read from the cache
    seconds: float  # time to encode (or to read the cache)
    owner: np.ndarray | None = None  # texts: (T,) int64 row index of each text
    bad: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # images: (N,) undecodable

    def summary(self) -> dict:
        out = {"key": self.key, "hit": self.hit, "rows": int(self.embeddings.shape[0]), "dim": int(self.embeddings.shape[1]), "seconds": round(self.seconds, 3)}
        if self.bad.size:
            out["bad_images"] = int(self.bad.sum())
        return out


# ----------------------------------------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------------------------------------


# process_state (accelerate's PartialState, asked for CPU processes without a GPU) is vltool.topology's.


def encode_device():
    """The device this process encodes on (accelerate's choice: its GPU under a launch, else CPU)."""
    return process_state().device


ENCODE_PRECISIONS = ("no", "bf16", "fp16")  # --precision of the evaluation commands; "no": float32, the exact path


def precision_context(precision: str):
    """Autocast for --precision bf16/fp16 on the encoding device; nothing for "no" (float32)."""
    import contextlib

    if precision == "no":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(encode_device().type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def with_precision(preprocessing: dict, precision: str) -> dict:
    """A cache key's preprocessing with the encoding precision, when not float32 (float32 keys stay as they were)."""
    return preprocessing if precision == "no" else {**preprocessing, "precision": precision}


# ----------------------------------------------------------------------------------------------------
# Loading the model to encode with (every command that encodes: evaluation, debias, mine-positives, ...)
# ----------------------------------------------------------------------------------------------------


_SHARED_MODELS: dict | None = None  # inside shared_models(): (spec, pretrained, cache_dir) -> the model loaded for it


@contextlib.contextmanager
def shared_models():
    """Within it, load_eval_model gives each (spec, pretrained, cache dir) the model it loaded the first time:
    `vltool evaluate` runs several commands on one model with one load. The models are only read (encoded
    with, never changed), so a command's numbers are those it gives alone."""
    global _SHARED_MODELS
    before, _SHARED_MODELS = _SHARED_MODELS, {}
    try:
        yield
    finally:
        _SHARED_MODELS = before


def load_eval_model(spec: str, pretrained: str | None = None, cache_dir: str | Path | None = None):
    """The model to encode with, on this process's device (_load_eval_model), shared inside shared_models()."""
    key = (str(spec), None if pretrained is None else str(pretrained), None if cache_dir is None else str(cache_dir))
    if _SHARED_MODELS is None:
        return _load_eval_model(spec, pretrained, cache_dir)
    if key not in _SHARED_MODELS:
        _SHARED_MODELS[key] = _load_eval_model(spec, pretrained, cache_dir)
    return _SHARED_MODELS[key]


def _load_eval_model(spec: str, pretrained: str | None = None, cache_dir: str | Path | None = None):
    """The model to encode with, on this process's device.

    A vltool model directory is opened lazily (LazyModel): when the cache already knows the fingerprint of
    its files, nothing is built until something has to be encoded, so a run served from the cache does
    not pay for building the towers. open_clip:ARCH, local-dir:PATH and hf:DIR are loaded at once; open_clip:ARCH
    without --pretrained is a randomly initialised model, loaded with a warning.
    """
    from vltool.model.load import load_model

    spec = str(spec)
    if spec.startswith("open_clip:") and "/" not in spec.partition(":")[2] and pretrained is None and not spec.startswith("open_clip:hf-hub:"):
        warn(f"{spec} without --pretrained (or open_clip:ARCH/TAG) evaluates randomly initialised weights")
    if not spec.startswith(("open_clip:", "local-dir:", "hf:")):
        from vltool.model.model_dir import resolve_model_dir

        return LazyModel(resolve_model_dir(spec), cache_dir)
    return load_model(spec, pretrained=pretrained, device=encode_device())


class LazyModel:
    """A vltool model directory whose towers are built on first use (vltool.model.load_model's LoadedModel).

    `fingerprint` (the model's weight fingerprint, vltool.model.fingerprint) is remembered in
    `<cache-dir>/models/<sha256 of config.json and model.safetensors>.json` after the first load: the file
    contents determine the fingerprint, so a later run reads it back without building the model.
    """

    def __init__(self, model_dir: Path, cache_dir: str | Path | None = None):
        from vltool.model.format import CONFIG_FILE, WEIGHTS_FILE
        from vltool.model.tokenizer import tokenizer_files_digest, tokenizer_source

        self._loaded = None
        self.model_dir = Path(model_dir)
        self.source = str(self.model_dir)
        self.revision = {}  # a vltool model directory: its weight fingerprint names the weights
        self.config = read_json(self.model_dir / CONFIG_FILE, "the model config")
        tc = self.config.get("tokenizer")
        self.tokenizer_files = tokenizer_files_digest(tokenizer_source(tc, self.model_dir)) if tc else None
        config_bytes = (self.model_dir / CONFIG_FILE).read_bytes()
        h = hashlib.sha256(config_bytes)
        with open(self.model_dir / WEIGHTS_FILE, "rb") as f:
            for chunk in iter(lambda: f.read(2**22), b""):
                h.update(chunk)
        self._index = EmbeddingCache(cache_dir).root / "models" / f"{h.hexdigest()}.json"
        try:
            self.fingerprint = json.loads(self._index.read_text())["fingerprint"]
        except (OSError, ValueError, KeyError):
            self.fingerprint = self._load().fingerprint

    def _load(self):
        if self._loaded is None:
            from vltool.model.load import load_model

            self._loaded = load_model(str(self.model_dir), device=encode_device())
            self.fingerprint = self._loaded.fingerprint  # (self.config stays the file's: keys never depend on loading)
            if is_main():
                try:
                    write_json_atomic(self._index, {"fingerprint": self.fingerprint, "model_dir": str(self.model_dir)})
                except OSError as e:  # a read-only cache: the fingerprint is computed again next time
                    cant_write(self._index.parents[1], e)
        return self._loaded

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def __getattr__(self, name: str):  # everything else (model, preprocess, encode_image, ...) needs the model
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._load(), name)


def model_record(m, spec: str, pretrained: str | None) -> dict:
    """The "model" part of a results or provenance record: what was asked for and what was loaded
    ("pinned": a Hub id or its branch or tag, at the commit it resolved to)."""
    revision = getattr(m, "revision", None) or {}
    pinned = str(spec)
    if revision.get("commit"):
        from vltool.model.pinning import pinned_spec

        pinned = pinned_spec(str(spec), revision)
    return {
        "spec": str(spec),
        "pinned": pinned,
        "pretrained": str(pretrained) if pretrained else None,
        "fingerprint": m.fingerprint,
        "source": getattr(m, "source", None),
        "revision": getattr(m, "revision", None) or None,  # a Hub commit, an open_clip tag's file and sha256
        "arch": m.config.get("arch"),
        "embed_dim": m.config.get("embed_dim"),
        "preprocess": m.config.get("preprocess"),
    }


# ----------------------------------------------------------------------------------------------------
# What a key is made of
# ----------------------------------------------------------------------------------------------------


def _tokenizer_description(m) -> dict:
    """The tokenizer's part of a key: the tokenizer entry of the model config (its settings) and the digest
    of its files (vltool.model.tokenizer_files_digest), read without loading the model or the tokenizer."""
    tok = getattr(m, "tokenizer", None) if not isinstance(m, LazyModel) else None
    out = dict(m.config["tokenizer"]) if "tokenizer" in m.config else (tok.describe() if tok is not None and hasattr(tok, "describe") else {})
    files = m.tokenizer_files if isinstance(m, LazyModel) else (tok.files_digest() if hasattr(tok, "files_digest") else None)
    if files is not None:
        out["files_sha256"] = files
    return out


def image_preprocessing(m, features: str = "post") -> dict:
    return {"kind": "image", "transform": m.config.get("preprocess"), "features": features}


def text_preprocessing(m) -> dict:
    return {"kind": "text", "tokenizer": _tokenizer_description(m)}


def dataset_key(m, data, column: str, preprocessing: dict) -> CacheKey:
    """The key of `column` of the loaded dataset `data` (vltool.io.LoadedDataset) encoded by model `m`."""
    return CacheKey(
        model=m.fingerprint,
        dataset=data.fingerprint,
        rows=row_filter(data.split, data.where),
        column=column,
        preprocessing=preprocessing,
    )


# ----------------------------------------------------------------------------------------------------
# Forward functions
# ----------------------------------------------------------------------------------------------------


def image_forward(m, features: str = "post") -> Callable:
    """images (B,3,H,W) -> (B, D) float32 on CPU.

    post: `m.encode_image` (after the projection, L2-normalised).
    pre:  before the projection, not normalised: a torchvision trunk's pooled features; an open_clip ViT's
          pooled token without `visual.proj`; an open_clip ModifiedResNet's layer4 averaged over space
          (its attention pool is the projection).
    """
    import torch

    if features not in FEATURES:
        raise UsageError(f"--features {features!r}: use pre or post")
    if features == "post":
        def post(x):
            return m.encode_image(x).float().cpu()

        return post
    model, device = m.model, m.device
    v = model.visual

    @torch.no_grad()
    def pre(x):
        x = x.to(device)
        if hasattr(v, "transformer") and hasattr(v, "proj"):  # open_clip VisionTransformer
            proj = v.proj
            v.proj = None
            try:
                f = v(x)
            finally:
                v.proj = proj
        elif hasattr(v, "attnpool") and hasattr(v, "layer4"):  # open_clip ModifiedResNet
            h = v.layer4(v.layer3(v.layer2(v.layer1(v.stem(x)))))  # (B, W, h, w)
            f = h.mean(dim=(2, 3))
        elif hasattr(v, "pooled"):  # a Hugging Face CLIP / SigLIP: the pooled output, before CLIP's projection
            f = v.pooled(x)
        elif hasattr(model, "image_trunk"):
            f = model.image_trunk(x)
        else:
            raise VltoolError("this model gives no features before its projection; use --features post")
        if isinstance(f, tuple):
            f = f[0]
        return f.float().cpu()

    return pre


# ----------------------------------------------------------------------------------------------------
# The batched, multi-process loop
# ----------------------------------------------------------------------------------------------------


def run_batches(
    n: int,
    batch_size: int,
    prepare: Callable[[int, int], Any],
    forward: Callable[[Any], Any],
    *,
    label: str = "encoding",
    progress: bool = True,
    workers: int = 1,
) -> np.ndarray:
    """Rows [0, n) in batches of `batch_size`: forward(prepare(a, b)) -> (b - a, D); returns (n, D) float32.

    `prepare` runs in `workers` background threads, a few batches ahead of `forward`. Under accelerate,
    process r handles global batches r, r + world, ...; the result is gathered in row order on every process.
    """
    state = process_state()
    world, rank = state.num_processes, state.process_index
    n_batches = math.ceil(n / batch_size) if n else 0
    mine = list(range(rank, n_batches, world))
    bounds = [(b * batch_size, min(n, (b + 1) * batch_size)) for b in mine]
    pieces: list[tuple[int, np.ndarray]] = []
    whole: np.ndarray | None = None  # one process: the (n, D) result, filled in place (no list to concatenate)
    bar = _progress(label, n, enabled=progress and state.is_main_process)
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            ahead = max(2, workers + 1)
            futures = [pool.submit(prepare, a, b) for a, b in bounds[:ahead]]
            for i, (b_idx, (a, b)) in enumerate(zip(mine, bounds)):
                batch = futures[i].result()
                futures[i] = None  # free the prepared batch
                if i + ahead < len(bounds):
                    futures.append(pool.submit(prepare, *bounds[i + ahead]))
                out = forward(batch)
                out = np.asarray(out.numpy() if hasattr(out, "numpy") else out, dtype=np.float32)
                if i == 0:
                    mark_first_batch()
                if world == 1:
                    if out.shape[0] != b - a:
                        raise VltoolError(f"internal error: a batch of {b - a} rows encoded to {out.shape[0]}")
                    if whole is None:
                        whole = np.empty((n, *out.shape[1:]), np.float32)
                    whole[a:b] = out
                else:
                    pieces.append((b_idx, out))
                if bar is not None:
                    bar[0].advance(bar[1], (b - a) * world)
    finally:
        if bar is not None:
            bar[0].stop()
    if whole is not None:
        return whole
    if world > 1:
        from accelerate.utils import gather_object

        pieces = gather_object(pieces)
    pieces.sort(key=lambda p: p[0])
    if not pieces:
        return np.zeros((0, 0), np.float32)
    out = np.concatenate([p for _, p in pieces])
    if out.shape[0] != n:
        raise VltoolError(f"internal error: encoded {out.shape[0]} rows, expected {n}")
    return out


def _progress(label: str, total: int, enabled: bool):
    """(bar, task) with advance(task, n), as run_batches uses it; None when off (--no-progress, or nothing to do)."""
    bar = Bar(label, total, unit="rows", enabled=enabled)
    if bar.prog is None:
        return None
    return _BarAdapter(bar), None


class _BarAdapter:
    def __init__(self, bar):
        self.bar = bar

    def advance(self, _task, n: int) -> None:
        self.bar.advance(n)

    def stop(self) -> None:
        self.bar.close()


def require_finite(emb: np.ndarray, m, tower: str, *, bad=None, what: str = "rows") -> np.ndarray:
    """`emb`, or an error (exit 1) naming the model and its `tower` ("image" or "text") when an embedding it
    made holds NaN or inf: weights holding NaN or inf give such embeddings for every input, and a NaN row
    would otherwise be read as an undecodable image, or ranked and scored as if it meant something (a NaN
    similarity sorts first: R@1 = 100%). `bad`: the rows left NaN on purpose (undecodable images)."""
    if emb.size == 0:
        return emb
    wrong = ~np.isfinite(emb).reshape(emb.shape[0], -1).all(axis=1)
    if bad is not None and len(bad):
        wrong &= ~np.asarray(bad, dtype=bool)
    n_wrong = int(wrong.sum())
    if n_wrong:
        source = getattr(m, "source", None) or "the model"
        raise VltoolError(
            f"the model {source} gives non-finite embeddings (NaN or inf) from its {tower} tower for {n_wrong:,} of "
            f"{emb.shape[0]:,} {what}: its {tower} weights hold NaN or inf (a diverged or damaged model); "
            "use another --model, or a checkpoint from before it diverged"
        )
    return emb


def _through_cache(cache: EmbeddingCache | None, key: CacheKey, ids: str, rows: int, compute: Callable[[], np.ndarray], extra: dict) -> tuple[np.ndarray, bool, float]:
    t0 = time.perf_counter()
    state = process_state()
    arr = cache.get(key, rows=rows, ids=ids) if cache is not None else None
    if state.num_processes > 1:  # every process encodes its share, or none does (another job may be writing)
        from accelerate.utils import gather_object

        if not all(gather_object([arr is not None])):
            arr = None
    if arr is not None:
        return arr, True, time.perf_counter() - t0
    arr = compute()
    if cache is not None and state.is_main_process:
        cache.put(key, arr, ids=ids, extra=extra)
    if state.num_processes > 1:
        state.wait_for_everyone()
    return arr, False, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------


def encode_images(
    m,
    data,
    *,
    column: str = C.IMAGE,
    features: str = "post",
    cache: EmbeddingCache | None = None,
    batch_size: int = 64,
    workers: int = 1,
    progress: bool = True,
    precision: str = "no",
) -> Encoded:
    """Embeddings of every image of `data` (a vltool.io.LoadedDataset), in row order; `precision` bf16/fp16
    encodes under autocast (float32 embeddings out, cached under their own key)."""
    import datasets
    import torch

    ds = data.dataset
    image_column(ds, column, data.spec)  # path strings are refused here, not decoded as bad images
    n = len(ds)
    key = dataset_key(m, data, column, with_precision(image_preprocessing(m, features), precision))
    ids = column_digest(ds, C.ID) if C.ID in ds.column_names else None  # (Arrow: no row formatted)
    raw = ds.select_columns([column])
    if isinstance(raw.features[column], datasets.Image):
        raw = raw.cast_column(column, datasets.Image(decode=False))
    size = m.config.get("preprocess", {}).get("size", 224)
    hw = (int(size), int(size)) if isinstance(size, (int, float)) else tuple(int(x) for x in size)  # (open_clip: an int or (H, W))
    bad_rows: list[int] = []

    def compute():
        forward = image_forward(m, features)  # the model is needed (and built, if lazy) only here
        preprocess = m.preprocess

        def prepare(a: int, b: int):
            values = raw[a:b][column]
            xs = []
            for j, v in enumerate(values):
                im = decode_image(v, rgb=False) if isinstance(v, dict) or v is None else v  # the transform converts
                if im is None:
                    bad_rows.append(a + j)
                    xs.append(torch.zeros(3, *hw))
                else:
                    xs.append(preprocess(im))
            return torch.stack(xs)

        with torch.inference_mode(), precision_context(precision):
            emb = run_batches(n, batch_size, prepare, forward, label=f"encoding {n:,} images", progress=progress, workers=workers)
        bad = _gather_rows(bad_rows)
        mask = np.zeros(n, bool)
        mask[np.asarray(sorted(bad), dtype=np.int64)] = True
        require_finite(emb, m, "image", bad=mask, what="images")  # (before the undecodable rows are made NaN)
        if bad:
            emb[mask] = np.nan
        return emb

    emb, hit, secs = _through_cache(cache, key, ids, n, compute, {"spec": data.spec, "model_source": getattr(m, "source", "")})
    bad = np.isnan(emb).any(axis=1) if emb.size else np.zeros(n, bool)
    return Encoded(emb, key.digest, hit, secs, bad=bad)


def _gather_rows(rows: list[int]) -> list[int]:
    state = process_state()
    if state.num_processes == 1:
        return list(rows)
    from accelerate.utils import gather_object

    return list(gather_object(list(rows)))


def text_owner(values: Sequence) -> tuple[list[str], np.ndarray]:
    """A text column's values (strings, or lists of strings) -> flat texts and the row of each.

    None, "" and whitespace-only texts are no text (vltool.checks.clean_text): they are left out, so a row
    whose texts are all empty owns none."""
    texts: list[str] = []
    owner: list[int] = []
    for i, v in enumerate(values):
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            t = clean_text(t)
            if t is not None:
                texts.append(t)
                owner.append(i)
    return texts, np.asarray(owner, dtype=np.int64)


def arrow_texts(column) -> tuple[Any, np.ndarray]:
    """`text_owner` on an Arrow column (strings, or lists of strings), by whole-column work: the texts that
    are not blank as one Arrow array (the column's own buffers where none is left out) and the row of each
    (T,). No Python object per row: a list of 10M captions is ~1.5 GB of str objects."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(column, pa.ChunkedArray):
        column = pa.chunked_array([column])
    lists = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
    texts, owners = [], []
    for a in range(0, len(column), checks.TEXT_SLICE_ROWS):
        part = column.slice(a, checks.TEXT_SLICE_ROWS).combine_chunks()  # (checks.X: read at call time; tests set it)
        if lists:  # (list_parent_indices counts from the start of one array)
            parent, flat = pc.list_parent_indices(part).to_numpy().astype(np.int64), pc.list_flatten(part)
        else:
            parent, flat = np.arange(len(part), dtype=np.int64), part
        keep = nonblank(flat)  # (texts of the slice,)
        texts.append(flat if keep.all() else flat.filter(pa.array(keep)))
        owners.append(parent[keep] + a)
    kind = column.type.value_type if lists else column.type
    owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    return pa.chunked_array(texts, type=kind), owner


def _encode_text_list(m, texts, batch_size: int, label: str, progress: bool, precision: str = "no") -> np.ndarray:
    """Embeddings of `texts` (a list of strings, or an Arrow string array: each batch becomes strings alone)."""
    import torch

    def prepare(a: int, b: int):
        return m.tokenize(texts[a:b] if isinstance(texts, list) else texts.slice(a, b - a).to_pylist())

    def forward(tokens):
        return m.encode_text(tokens).float().cpu()

    with torch.inference_mode(), precision_context(precision):
        emb = run_batches(len(texts), batch_size, prepare, forward, label=label, progress=progress, workers=1)
    return require_finite(emb, m, "text", what="texts")


def encode_texts(
    m,
    data,
    *,
    column: str = C.CAPTION,
    cache: EmbeddingCache | None = None,
    batch_size: int = 256,
    progress: bool = True,
    precision: str = "no",
) -> Encoded:
    """Embeddings of a text column (strings, or lists of strings such as `captions`); `owner` maps texts to rows."""
    ds = data.dataset
    text_column(ds, column, data.spec, allow_list=True)
    texts, owner = arrow_texts(arrow_column(ds, column))
    require_texts(len(texts), len(ds), column, data.spec)
    key = dataset_key(m, data, column, with_precision(text_preprocessing(m), precision))
    ids = strings_digest(texts)  # texts_digest, on the Arrow array
    emb, hit, secs = _through_cache(
        cache, key, ids, len(texts),
        lambda: _encode_text_list(m, texts, batch_size, f"encoding {len(texts):,} texts", progress, precision),
        {"spec": data.spec, "model_source": getattr(m, "source", "")},
    )
    return Encoded(emb, key.digest, hit, secs, owner=owner)


def encode_prompts(
    m,
    texts: Sequence[str],
    *,
    cache: EmbeddingCache | None = None,
    batch_size: int = 256,
    progress: bool = True,
    precision: str = "no",
) -> Encoded:
    """Embeddings of a list of texts that is not a dataset column (class prompts), keyed by their digest."""
    texts = [str(t) for t in texts]
    digest = texts_digest(texts)
    key = CacheKey(model=m.fingerprint, dataset=digest, rows=row_filter(None, ()), column=PROMPTS_COLUMN,
                   preprocessing=with_precision(text_preprocessing(m), precision))
    emb, hit, secs = _through_cache(
        cache, key, digest, len(texts),
        lambda: _encode_text_list(m, texts, batch_size, f"encoding {len(texts):,} prompts", progress, precision),
        {"model_source": getattr(m, "source", "")},
    )
    return Encoded(emb, key.digest, hit, secs)
