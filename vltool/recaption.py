"""`vltool recaption`: new captions from an image captioner, or paraphrases from a language model.

Santurkar et al. re-caption CC and YFCC images with BLIP, several captions per image by nucleus sampling
(top-p 0.9, repetition penalty 1.1, 5 to 40 tokens, a different seed per caption; section 3.2, 3.3,
appendix A.5), and paraphrase captions with GPT-J prompted with four (caption, paraphrase) pairs,
sampling with a temperature (section 4, appendix A.8). FFF (section 4.2) captions with BLIP-2 and keeps
the k sequences of a beam search. Every model is a local directory loaded with `from_pretrained`.

Determinism: every sampled caption has its own random stream, seeded from (--seed, row id, caption
index): `RowSampler` draws each row's next token with that row's generator inside the ordinary
`model.generate` loop. A row's captions therefore do not depend on the batch size, the shard, the number
of processes, or on which rows were done before an interruption.

Resumable work: rows are cut into shards of `shard_size`; each finished shard is written at once to
`OUT.partial/shards/` (atomically), and a rerun of the same job skips the shards already there. Under
`accelerate launch` process r takes the shards i with i % num_processes == r and process 0 merges them.
When every shard is done, the dataset is written atomically to OUT and OUT.partial is removed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSeq2SeqLM, AutoProcessor,
                          AutoTokenizer, LogitsProcessor, LogitsProcessorList)
from transformers.models.auto import modeling_auto as ma
from transformers.utils import logging as hf_logging

from vltool import columns as C
from vltool import provenance
from vltool import hub
from vltool.checks import clean_text, require_texts, text_column
from vltool.console import err, progress_enabled
from vltool.console import log as console_log
from vltool.errors import DiskFull, UsageError, VltoolError, disk_full_cause, disk_full_message
from vltool.io.atomic import save_dataset, write_json_atomic
from vltool.io.images import decode_image, require_a_decodable_image
from vltool.io.loading import load_dataset, LoadedDataset
from vltool.io.outputs import check_output
from vltool.paraphrase import DEFAULT_EXAMPLES, PROMPT_HEADER, load_examples, one_line, paraphrase_prompt  # noqa: F401 (re-exported)
from vltool.topology import computes, process_state, warn

STRATEGIES = ("nucleus", "beam")
PRECISIONS = {"no": "float32", "bf16": "bfloat16", "fp16": "float16"}  # --precision (besides auto): the weights' dtype
OLD_DTYPES = {dtype: name for name, dtype in PRECISIONS.items()}  # the old --dtype values
ORIGINAL = "original"  # caption_source of a text that was in the input and has no recorded source


@dataclass
class RecaptionConfig:
    """Options of `vltool recaption`, one field per option of the same name (help: `vltool recaption --help`).
    Strategy-dependent defaults are None here; `settings()` resolves them."""

    model: Path | None = None
    paraphrase: bool = False
    lm: Path | None = None
    examples: Path | None = None
    text_column: str = C.CAPTION
    num_captions: int = 5
    strategy: str = "nucleus"
    top_p: float | None = None
    temperature: float | None = None
    repetition_penalty: float | None = None
    min_new_tokens: int | None = None
    max_new_tokens: int = 40  # the paper's range is 5 to 40
    num_beams: int | None = None
    prompt: str | None = None
    keep_prompt: bool = False
    replace: bool = False
    set_caption: bool = False
    seed: int = 0  # each caption's seed comes from this, the row id and the caption index
    batch_size: int = 32
    shard_size: int = 1024  # part of the job's identity
    device: str = "auto"
    precision: str = "auto"  # auto | no | bf16 | fp16: the dtype the model's weights are cast to (resolve_dtype)
    threads: int | None = None  # torch's intra-op threads (None: torch's own)
    max_shards: int | None = None
    restart: bool = False

    @property
    def mode(self) -> str:
        return "paraphrase" if self.paraphrase else "recaption"

    @property
    def model_path(self) -> Path | None:
        return self.lm if self.paraphrase else self.model

    def settings(self) -> dict:
        """The generation settings, with strategy defaults filled in (recorded in vltool.json)."""
        para = self.paraphrase
        sampling = self.strategy == "nucleus"
        return {
            "mode": self.mode,
            "strategy": self.strategy,
            "num_captions": self.num_captions,
            "top_p": (self.top_p if self.top_p is not None else (1.0 if para else 0.9)) if sampling else None,
            "temperature": (self.temperature if self.temperature is not None else (0.8 if para else 1.0))
            if sampling else None,
            "repetition_penalty": self.repetition_penalty
            if self.repetition_penalty is not None else (1.1 if sampling and not para else 1.0),
            "min_new_tokens": self.min_new_tokens if self.min_new_tokens is not None else (1 if para else 5),
            "max_new_tokens": self.max_new_tokens,
            "num_beams": (self.num_beams or self.num_captions) if not sampling else None,
            "prompt": self.prompt,
            "keep_prompt": self.keep_prompt,
            "seed": self.seed,
            "column": self.text_column if para else None,
        }

    def validate(self) -> None:
        p = []
        if self.paraphrase:
            if self.lm is None:
                p.append("--paraphrase needs --lm LOCAL_LM (a causal language model directory)")
            if self.model is not None:
                p.append("--model is the captioner; with --paraphrase give the language model as --lm")
            if self.prompt is not None or self.keep_prompt:
                p.append("--prompt and --keep-prompt are for the captioner, not --paraphrase")
        else:
            if self.model is None:
                p.append("give --model LOCAL_CAPTIONER to re-caption images, or --paraphrase --lm LOCAL_LM")
            if self.lm is not None:
                p.append("--lm is used with --paraphrase")
            if self.examples is not None:
                p.append("--examples is used with --paraphrase")
            if self.keep_prompt and not self.prompt:
                p.append("--keep-prompt needs --prompt")
        if self.examples is not None and not Path(self.examples).expanduser().is_file():
            p.append(f"--examples {self.examples}: no such file")
        if self.strategy not in STRATEGIES:
            p.append(f"--strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.num_captions < 1:
            p.append(f"--num-captions must be >= 1, got {self.num_captions}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            p.append(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.temperature is not None and not self.temperature > 0.0:
            p.append(f"--temperature must be > 0, got {self.temperature}")
        if self.strategy == "beam" and (self.top_p is not None or self.temperature is not None):
            p.append("--top-p and --temperature apply to --strategy nucleus, not beam")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0.0:
            p.append(f"--repetition-penalty must be > 0, got {self.repetition_penalty}")
        if self.max_new_tokens < 1:
            p.append(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.min_new_tokens is not None and not 0 <= self.min_new_tokens <= self.max_new_tokens:
            p.append(f"--min-new-tokens must be in [0, --max-new-tokens], got {self.min_new_tokens}")
        if self.num_beams is not None:
            if self.strategy != "beam":
                p.append("--num-beams applies to --strategy beam")
            elif self.num_beams < self.num_captions:
                p.append(f"--num-beams ({self.num_beams}) must be >= --num-captions ({self.num_captions})")
        for name, value in (("--batch-size", self.batch_size), ("--shard-size", self.shard_size)):
            if value < 1:
                p.append(f"{name} must be >= 1, got {value}")
        if self.max_shards is not None and self.max_shards < 1:
            p.append(f"--max-shards must be >= 1, got {self.max_shards}")
        if self.precision != "auto" and self.precision not in PRECISIONS:
            p.append(f"--precision must be one of auto, {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.threads is not None and self.threads < 1:
            p.append(f"--threads must be >= 1, got {self.threads}")
        if not (self.device in ("auto", "cpu", "mps") or self.device.startswith("cuda")):
            p.append(f"--device must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")
        if p:
            raise UsageError("; ".join(p))


# ---------------------------------------------------------------------------------------------------------
# Seeds (the language model's prompt: vltool.paraphrase)


def caption_seed(seed: int, row_id: str, index: int) -> int:
    """The 64-bit seed of caption `index` of row `row_id` (independent of batching and processes)."""
    digest = hashlib.blake2b(f"{seed}\x00{row_id}\x00{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def make_row_sampler(generators: list, temperature: float, top_p: float):
    """A LogitsProcessor that samples each sequence's next token with that sequence's own generator.

    It runs last in `generate`'s processor list (after repetition penalty and minimum length), applies
    the temperature and the nucleus (as TopPLogitsWarper does), draws one uniform number per sequence
    from its generator and picks the token by inverse CDF. It returns scores that are 0 for the picked
    token and -inf elsewhere, so generate's own sampling step can only pick that token.
    """
    class RowSampler(LogitsProcessor):
        def __call__(self, input_ids, scores):  # scores (N, V), N = rows * k in generate's order
            if scores.shape[0] != len(generators):
                raise VltoolError(f"internal: {scores.shape[0]} sequences but {len(generators)} generators")
            logits = scores.float() / temperature
            if top_p < 1.0:
                sorted_logits, sorted_idx = torch.sort(logits, descending=False)  # (N, V) ascending
                cum = sorted_logits.softmax(-1).cumsum(-1)
                drop_sorted = cum <= (1.0 - top_p)  # the low tail outside the nucleus
                drop_sorted[:, -1:] = False  # keep at least the most likely token
                drop = drop_sorted.scatter(1, sorted_idx, drop_sorted)
                logits = logits.masked_fill(drop, float("-inf"))
            cdf = logits.softmax(-1).double().cumsum(-1)  # (N, V)
            u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])  # (N,)
            target = u.to(cdf.device).unsqueeze(1) * cdf[:, -1:]  # (N, 1)
            pick = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[1] - 1)  # (N, 1)
            out = torch.full_like(scores, float("-inf"))
            return out.scatter_(1, pick, 0.0)

    return RowSampler()


# ---------------------------------------------------------------------------------------------------------
# Models


def _auto_names() -> tuple[dict, dict]:
    """model_type -> class name of transformers' image-to-text models, and of its language models."""
    captioners = dict(ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    captioners.update(getattr(ma, "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES", {}))  # older transformers
    return captioners, {**_causal_names(), **_seq2seq_names()}


def inspect_model(path: Path | str, paraphrase: bool) -> dict:
    """Check that `path` is a local model of the right kind without loading its weights; describe it."""
    opt = "--lm" if paraphrase else "--model"
    revision, name, spec = {}, None, str(path)
    if str(path).startswith(hub.HF_SPEC):  # hf:DIR or hf:ORG/NAME[@REVISION], through huggingface_hub's cache
        found = hub.resolve_hf(str(path))
        path, revision = found.path, found.revision
        name = revision["repo"].split("/")[-1] if revision else None
    path = Path(path).expanduser()
    shown = spec if revision else str(path)  # messages name a Hub id as the user spelt it, not its snapshot folder
    if not path.exists():
        raise UsageError(
            f"{opt} {path} does not exist; give a local model directory (written by save_pretrained) or a Hub id "
            "hf:ORG/NAME[@REVISION]"
        )
    if not (path / "config.json").is_file():
        raise UsageError(f"{opt} {shown} is not a transformers model directory (it has no config.json)")
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # unknown model_type, corrupt JSON: transformers raises several kinds
        raise UsageError(f"{opt} {shown}: cannot read its config.json ({e})") from None
    captioners, lms = _auto_names()
    model_type = config.model_type
    archs = list(getattr(config, "architectures", None) or [])
    what = f"a {model_type!r} model" + (f" ({', '.join(archs)})" if archs else "")
    if paraphrase:
        if model_type not in lms:
            hint = "; it is an image captioner: use it as --model without --paraphrase" if model_type in captioners else ""
            raise UsageError(f"--lm {shown} is {what}, not a causal or seq2seq language model{hint}")
        kind = "causal" if model_type in _causal_names() else "seq2seq"
    else:
        known = set(captioners.values())
        if model_type not in captioners or (archs and not any(a in known for a in archs)):
            hint = "; to paraphrase captions with a language model use --paraphrase --lm" if model_type in lms else ""
            raise UsageError(
                f"--model {shown} is {what}, not an image captioner: recaption needs an image-to-text generation "
                f"model such as BLIP (BlipForConditionalGeneration) or BLIP-2 (Blip2ForConditionalGeneration){hint}"
            )
        kind = "captioner"
    return {
        "path": str(path.resolve()),
        "shown": shown,  # what messages call it
        "name": name or path.resolve().name,
        **({"revision": revision} if revision else {}),  # a Hub id: the commit it resolved to
        "model_type": model_type,
        "architectures": archs,
        "kind": kind,
        "fingerprint": model_fingerprint(path),
    }


def _causal_names() -> dict:
    return dict(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _seq2seq_names() -> dict:
    return dict(ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)


def model_fingerprint(path: Path) -> str:
    """SHA-256 of config.json and of each weight file's name, size and modification time (not contents:
    hashing gigabytes of weights would cost more than a shard of work)."""
    h = hashlib.sha256((path / "config.json").read_bytes())
    for f in sorted(path.iterdir()):
        if f.is_file() and f.suffix in (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5"):
            st = f.stat()
            h.update(f"{f.name}\x00{st.st_size}\x00{st.st_mtime_ns}\x00".encode())
    return h.hexdigest()


def resolve_device(device: str) -> str:
    if device != "auto":
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UsageError(f"--device {device}: CUDA is not available on this machine")
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def saved_dtype(path) -> str | None:
    """The dtype a model directory's config.json says its weights were saved in ("dtype", or transformers'
    older "torch_dtype", at the top or in its text config), or None."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    for part in (config, config.get("text_config") or {}):
        for key in ("dtype", "torch_dtype"):
            if isinstance(part.get(key), str):
                return part[key]
    return None


def resolve_dtype(precision: str, device: str, model_path=None):
    """The torch dtype of the model's weights for --precision (no: float32, bf16, fp16). auto: float32 on CPU. On CUDA the model's own half precision when it was saved in one
    (bfloat16 stays bfloat16: a bf16-trained model overflows in float16), else bfloat16 where the GPU
    computes it, else float32; never float16 unless the model was saved in it."""
    if precision != "auto":
        return getattr(torch, PRECISIONS[precision])
    if not device.startswith("cuda"):
        return torch.float32
    own = saved_dtype(model_path) if model_path is not None else None
    if own in ("bfloat16", "float16"):
        return getattr(torch, own)
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32


class _Quiet:
    """Silence transformers' info logs and progress bars while loading (vltool shows its own)."""

    def __enter__(self):
        self._level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        return self

    def __exit__(self, *exc):
        hf_logging.set_verbosity(self._level)
        hf_logging.enable_progress_bar()
        return False


@dataclass
class Generator:
    """A loaded model and the settings it generates with. `__call__(items, ids)` returns, for each
    item (an image or a text), its list of generated texts (empty outputs removed)."""

    kind: str  # captioner | causal | seq2seq
    model: Any
    processor: Any  # the captioner's processor, or the language model's tokenizer
    settings: dict
    device: str
    dtype: Any
    examples: tuple = ()
    stop_ids: list = field(default_factory=list)  # paraphraser: tokens that end the output line
    prompt_text: str = ""  # captioner: the prompt as the tokenizer decodes it (stripped from outputs)

    @property
    def tokenizer(self):
        return getattr(self.processor, "tokenizer", self.processor)

    def _generate_kwargs(self, ids: Sequence[str]) -> dict:
        s = self.settings
        k = s["num_captions"]
        kw = dict(
            max_new_tokens=s["max_new_tokens"],
            min_new_tokens=s["min_new_tokens"],
            repetition_penalty=s["repetition_penalty"],
            num_return_sequences=k,
        )
        if s["strategy"] == "nucleus":
            gens = [torch.Generator().manual_seed(caption_seed(s["seed"], i, j)) for i in ids for j in range(k)]
            sampler = make_row_sampler(gens, s["temperature"], s["top_p"])
            # generate's own warpers are neutral: RowSampler has already chosen the token
            kw.update(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, num_beams=1,
                      logits_processor=LogitsProcessorList([sampler]))
        else:
            kw.update(do_sample=False, num_beams=s["num_beams"])
        return kw

    def prepare(self, items: Sequence[Any]) -> Any:
        """CPU-side work for one batch (image decoding, processor / tokenizer); may run on a thread."""
        if self.kind == "captioner":
            image_processor = getattr(self.processor, "image_processor", self.processor)
            images = [processor_input(im, image_processor) for im in items]
            text = [self.settings["prompt"]] * len(images) if self.settings["prompt"] else None
            return self.processor(images=images, text=text, return_tensors="pt")
        prompts = [paraphrase_prompt(t, self.examples) for t in items]
        return self.processor(prompts, return_tensors="pt", padding=True)

    def __call__(self, items: Sequence[Any], ids: Sequence[str], prepared: Any = None) -> list[list[str]]:
        if not items:
            return []
        inputs = prepared if prepared is not None else self.prepare(items)
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        kw = self._generate_kwargs(ids)
        if self.kind != "captioner":
            tok = self.tokenizer
            kw.update(eos_token_id=self.stop_ids, pad_token_id=tok.pad_token_id)
        with torch.inference_mode():
            out = self.model.generate(**inputs, **kw)  # (B * k, L)
        if self.kind == "causal":
            out = out[:, inputs["input_ids"].shape[1]:]  # the continuation after the prompt
        texts = self.tokenizer.batch_decode(out, skip_special_tokens=True)
        texts = [self._clean(t) for t in texts]
        k = self.settings["num_captions"]
        return [[t for t in texts[i * k:(i + 1) * k] if t] for i in range(len(items))]

    def _clean(self, text: str) -> str:
        if self.kind == "captioner":
            if self.prompt_text and not self.settings["keep_prompt"] and text.startswith(self.prompt_text):
                text = text[len(self.prompt_text):]
            return one_line(text)
        return one_line(text.split("\n", 1)[0])  # the output line only


def processor_input(image, image_processor):
    """The image as the model's processor is handed it: in its own mode when the processor converts it to
    RGB itself (transparency composited on white, transformers' convert_rgb); composited on white the
    same way here when it does not (a processor without do_convert_rgb would read RGBA as 4 channels)."""
    if image.mode == "RGB" or getattr(image_processor, "do_convert_rgb", None):
        return image
    from vltool.transforms import composite_on_white

    return composite_on_white(image)


def newline_token_ids(tokenizer) -> list[int]:
    """Every token whose text contains a line break: generation stops at the end of the output line."""
    n = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
    return [i for i, t in enumerate(texts) if "\n" in t]


def load_generator(info: dict, config: RecaptionConfig, device: str) -> Generator:
    """Load the model directory described by `inspect_model` with its processor or tokenizer."""
    path, kind = info["path"], info["kind"]
    shown = info.get("shown", path)
    dtype = resolve_dtype(config.precision, device, path)
    opt = "--lm" if config.paraphrase else "--model"
    settings = config.settings()
    with _Quiet():
        try:
            if kind == "captioner":
                processor = AutoProcessor.from_pretrained(path, local_files_only=True)
                if not hasattr(processor, "image_processor") and not hasattr(processor, "tokenizer"):
                    raise UsageError(f"--model {shown}: its processor is not an image + text processor")
                model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True, dtype=dtype)
            else:
                processor = AutoTokenizer.from_pretrained(path, local_files_only=True)
                cls = AutoModelForCausalLM if kind == "causal" else AutoModelForSeq2SeqLM
                model = cls.from_pretrained(path, local_files_only=True, dtype=dtype)
        except UsageError:
            raise
        except (OSError, ValueError, KeyError) as e:
            what = "processor (preprocessor_config.json, tokenizer files)" if kind == "captioner" else "tokenizer"
            raise UsageError(f"{opt} {shown}: cannot load the model or its {what}: {_first_line(e)}") from None
        except Exception as e:  # a damaged weights file (safetensors' SafetensorError: truncated, bad header), ...
            raise VltoolError(f"{opt} {shown}: cannot load its weights ({type(e).__name__}: {_first_line(e)}); "
                              "the files are damaged or incomplete: download or save them again") from None
    model.to(device).eval()
    gen = Generator(kind=kind, model=model, processor=processor, settings=settings, device=device, dtype=dtype)
    tok = gen.tokenizer
    if kind == "captioner":
        if settings["prompt"]:
            ids = tok(settings["prompt"], add_special_tokens=False)["input_ids"]
            gen.prompt_text = tok.decode(ids, skip_special_tokens=True)
    else:
        gen.examples = load_examples(config.examples)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        if kind == "causal":
            tok.padding_side = "left"  # prompts of different lengths end where generation starts
        stops = newline_token_ids(tok) if kind == "causal" else []
        if tok.eos_token_id is not None:
            stops.append(tok.eos_token_id)
        if not stops:
            raise UsageError(f"--lm {shown}: its tokenizer has no end-of-sequence token and no line-break token")
        gen.stop_ids = sorted(set(stops))
    return gen


# ---------------------------------------------------------------------------------------------------------
# Work directory: shards, resume, merge


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def work_dir_for(out: Path) -> Path:
    return out.parent / f"{out.name}.partial"


@dataclass
class WorkDir:
    """OUT.partial: job.json (what is computed) and shards/NNNNNN.json (finished shards)."""

    root: Path

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    def shard_path(self, i: int) -> Path:
        return self.shards / f"{i:06d}.json"

    def open(self, job: dict, restart: bool) -> int:
        """Create or resume; returns how many shards were already done. A different job is refused."""
        job_file = self.root / "job.json"
        if restart and self.root.exists():
            shutil.rmtree(self.root)
        if job_file.is_file():
            try:
                old = json.loads(job_file.read_text())
            except json.JSONDecodeError:
                old = None
            if old != job and not any(self.shards.glob("*.json")):
                old = job  # no shard finished (e.g. the model failed to load): nothing to lose, start this job
                write_json_atomic(job_file, job)
            if old != job:
                diff = sorted(k for k in set(job) | set(old or {}) if (old or {}).get(k) != job.get(k))
                raise UsageError(
                    f"{self.root} holds unfinished work of a different job (differs in: {', '.join(diff)}); "
                    "rerun with the same options to resume it, or pass --restart to discard it"
                )
        self.shards.mkdir(parents=True, exist_ok=True)
        if not job_file.is_file():
            write_json_atomic(job_file, job)  # every process writes the same content: a race is harmless
        return len(list(self.shards.glob("*.json")))

    def done(self, i: int) -> bool:
        return self.shard_path(i).is_file()

    def write(self, i: int, ids: list[str], captions: list[list[str]], seconds: float) -> None:
        path = self.shard_path(i)
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        tmp.write_text(json.dumps({"shard": i, "ids": ids, "captions": captions, "seconds": round(seconds, 3)},
                                  ensure_ascii=False))
        os.replace(tmp, path)  # a killed process leaves a finished shard or none, never half of one

    def read(self, i: int, ids: list[str]) -> list[list[str]]:
        try:
            rec = json.loads(self.shard_path(i).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise VltoolError(f"{self.shard_path(i)} is unreadable ({e}); delete it and rerun to redo that shard") from e
        if rec.get("ids") != ids or len(rec.get("captions", ())) != len(ids):
            raise VltoolError(
                f"{self.shard_path(i)} does not hold the rows of shard {i} (the input changed?); "
                "rerun with --restart"
            )
        return rec["captions"]


@dataclass
class Dist:
    """Which share of the shards this process does."""

    rank: int
    world: int
    device: str


def distributed(config: RecaptionConfig, process_index: int | None, num_processes: int | None) -> Dist:
    """The process's rank and device: explicit (tests, or running one share by hand), else
    vltool.topology.process_state(): the launcher's (`accelerate launch`, torchrun; mpirun on CPU) or a single process.

    On a CPU-only machine process_state asks accelerate for CPU processes, so that under
    `accelerate launch --multi_gpu --num_processes N` it reports MULTI_CPU, rank r of N (a bare
    `PartialState()` would report one process there, and every process would do every shard). The
    processes do not communicate through the process group: they meet in OUT.partial."""
    if process_index is not None:
        return Dist(process_index, num_processes or 1, resolve_device(config.device))
    state = process_state()
    device = resolve_device(config.device)
    if state.num_processes > 1 and config.device == "auto" and device == "cuda":
        device = f"cuda:{state.local_process_index}"  # one GPU per process, as accelerate assigns them
    return Dist(state.process_index, state.num_processes, device)


class Interrupted(VltoolError):
    """Ctrl-C or a signal during generation: finished shards are kept."""

    exit_code = 130


def _progress():
    """A progress bar on stderr: rows done of this process's share, rows per second, time left."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
        console=err, disable=not progress_enabled(),
    )


def run_shards(
    ds, work: WorkDir, todo: list[int], n: int, config: RecaptionConfig, gen_factory: Callable[[], Generator],
    input_column: str, dist: Dist, log: Callable[[str], None],
) -> dict:
    """Generate every shard in `todo` (in order), writing each as soon as it is finished."""
    if config.max_shards is not None:
        todo = todo[: config.max_shards]
    rows_todo = sum(min(n, (i + 1) * config.shard_size) - i * config.shard_size for i in todo)
    stats = {"shards_run": 0, "rows_run": 0, "generate_seconds": 0.0}
    if not todo:
        return stats
    gen = gen_factory()
    cols = ds.select_columns([C.ID, input_column])
    # images are decoded here, through the policy every command shares: an undecodable or oversized image
    # is a bad image, skipped (its row gets no new caption) and counted, never the end of the run
    images = isinstance(cols.features[input_column], datasets.Image)
    if images:
        cols = cols.cast_column(input_column, datasets.Image(decode=False))
    load = functools.partial(load_batch, cols, input_column, images, gen)
    stats["bad_images"] = 0
    unit = "images" if gen.kind == "captioner" else "captions"
    label = f"{config.mode}" + (f" [process {dist.rank}/{dist.world}]" if dist.world > 1 else "")
    t_start = time.perf_counter()
    with _progress() as progress, ThreadPoolExecutor(max_workers=1) as pool:
        task = progress.add_task(label, total=rows_todo, rate="")

        def advance(rows: int) -> None:
            stats["rows_run"] += rows
            progress.update(task, advance=rows, rate=f"{stats['rows_run'] / (time.perf_counter() - t_start):.1f} {unit}/s")

        try:
            for i in todo:
                t0 = time.perf_counter()
                ids, outputs = generate_shard(i * config.shard_size, min(n, (i + 1) * config.shard_size), config.batch_size,
                                              gen, load, pool, stats, advance)
                work.write(i, ids, outputs, time.perf_counter() - t0)
                stats["shards_run"] += 1
        except KeyboardInterrupt:
            raise Interrupted(
                f"interrupted after {stats['shards_run']} new shard(s); finished shards are kept in {work.root}: "
                "rerun the same command to continue"
            ) from None
    if stats["bad_images"]:
        warn(f"{stats['bad_images']:,} images could not be decoded (corrupt, missing, or over the size limit); "
             "their rows get no new captions")
    stats["generate_seconds"] = round(time.perf_counter() - t_start, 3)
    stats["rows_per_second"] = round(stats["rows_run"] / max(stats["generate_seconds"], 1e-9), 2)
    log(f"{config.mode}: {stats['rows_run']:,} rows in {stats['generate_seconds']:.1f}s "
        f"({stats['rows_per_second']:.1f} {unit}/s)")
    return stats


def load_batch(cols, input_column: str, images: bool, gen: Generator, span: tuple[int, int]):
    """Rows span[0]..span[1] of `cols`, ready for the generator: (ids, the positions of the rows with an
    input, those inputs, the generator's prepared batch, the number of bad images)."""
    rows = cols[span[0]:span[1]]
    values = rows[input_column]
    bad = 0
    if images:
        decoded = [decode_image(v, rgb=False) if v is not None else None for v in values]  # (converted as the processor does)
        bad = sum(v is not None and d is None for v, d in zip(values, decoded))
        values = decoded
    keep = [j for j, x in enumerate(values) if _has_input(x)]
    items = [values[j] for j in keep]
    return rows[C.ID], keep, items, (gen.prepare(items) if items else None), bad


def generate_shard(lo: int, hi: int, batch_size: int, gen: Generator, load: Callable, pool: ThreadPoolExecutor, stats: dict,
                   advance: Callable[[int], None]) -> tuple[list[str], list[list[str]]]:
    """One shard, rows lo..hi in batches: (its ids, each row's new captions; none for a row without input).
    The next batch is loaded (decoded, prepared) on `pool` while the generator runs on this one."""
    ids: list[str] = []
    outputs: list[list[str]] = []
    batches = [(b, min(hi, b + batch_size)) for b in range(lo, hi, batch_size)]
    nxt = pool.submit(load, batches[0])
    for bi in range(len(batches)):
        batch_ids, keep, items, prepared, bad = nxt.result()
        stats["bad_images"] += bad
        if bi + 1 < len(batches):
            nxt = pool.submit(load, batches[bi + 1])  # decode the next batch while this one runs
        got = gen(items, [batch_ids[j] for j in keep], prepared) if items else []
        per_row: list[list[str]] = [[] for _ in batch_ids]
        for j, caps in zip(keep, got):
            per_row[j] = caps
        ids.extend(batch_ids)
        outputs.extend(per_row)
        advance(len(batch_ids))
    return ids, outputs


def _has_input(x) -> bool:
    if x is None:
        return False
    if isinstance(x, str):
        return bool(x.strip())
    return True


# ---------------------------------------------------------------------------------------------------------
# Output


def source_label(config: RecaptionConfig, model_info: dict) -> str:
    """caption_source entry of a generated text: mode, strategy and model directory name."""
    return f"{config.mode}:{config.strategy}:{model_info['name']}"


def assemble(ds, generated: list[list[str]], config: RecaptionConfig, label: str):
    """The output dataset: captions (existing + new, or new only), caption (with --set-caption) and
    caption_source {caption, captions}, the rest of the columns untouched."""
    n = len(ds)
    names = ds.column_names
    existing = ds[C.CAPTIONS] if C.CAPTIONS in names else None
    caption = ds[C.CAPTION] if C.CAPTION in names else None
    old_src = ds[C.CAPTION_SOURCE] if C.CAPTION_SOURCE in names else None
    new_caps, new_src, new_caption, caption_src = [], [], [], []
    for r in range(n):
        gen = generated[r]
        if existing is not None:
            old = [t for t in (existing[r] or [])]
        elif caption is not None and caption[r]:
            old = [caption[r]]  # no captions column: the row's existing text is its caption
        else:
            old = []
        prev = old_src[r] if old_src is not None and old_src[r] else None
        old_labels = prev["captions"] if prev and len(prev.get("captions") or []) == len(old) else [ORIGINAL] * len(old)
        cap_label = (prev or {}).get("caption") or (ORIGINAL if caption is not None and caption[r] is not None else None)
        if config.replace:
            new_caps.append(list(gen))
            new_src.append([label] * len(gen))
        else:
            new_caps.append(old + list(gen))
            new_src.append(list(old_labels) + [label] * len(gen))
        if config.set_caption and gen:
            new_caption.append(gen[0])
            caption_src.append(label)
        else:
            new_caption.append(caption[r] if caption is not None else None)
            caption_src.append(cap_label)
    order = list(names)
    if ds._indices is not None:
        ds = ds.flatten_indices()
    string_list = datasets.List(datasets.Value("string")) if hasattr(datasets, "List") else \
        datasets.Sequence(datasets.Value("string"))
    caps_feature = ds.features[C.CAPTIONS] if existing is not None else string_list
    drop = [c for c in (C.CAPTIONS, C.CAPTION_SOURCE) if c in names]
    if config.set_caption and caption is not None:
        drop.append(C.CAPTION)
    ds = ds.remove_columns(drop)
    ds = ds.add_column(C.CAPTIONS, new_caps, feature=caps_feature)
    if config.set_caption:
        ds = ds.add_column(C.CAPTION, new_caption, feature=datasets.Value("string"))
        if C.CAPTION not in order:
            order.append(C.CAPTION)
    source_feature = datasets.Features({"caption": datasets.Value("string"), "captions": string_list})
    ds = ds.add_column(C.CAPTION_SOURCE, [{"caption": c, "captions": s} for c, s in zip(caption_src, new_src)],
                       feature=source_feature)
    for c in (C.CAPTIONS, C.CAPTION_SOURCE):
        if c not in order:
            order.append(c)
    return ds.select_columns(order)


def generation_stats(ds, generated: list[list[str]], config: RecaptionConfig, input_column: str) -> dict:
    n = len(generated)
    k = config.num_captions
    flat = [t for g in generated for t in g]
    col = ds.data.column(input_column)
    if ds._indices is not None:
        col = col.take(ds._indices.column(0))
    missing = int(pc.sum(pc.is_null(col)).as_py() or 0)
    if input_column != C.IMAGE:  # blank texts are not paraphrased either
        missing += int(pc.sum(pc.equal(pc.utf8_trim_whitespace(pc.drop_null(col)), "")).as_py() or 0)
    rows_with = sum(1 for g in generated if g)
    distinct_per_row = [len(set(g)) for g in generated if g]
    sample = list(range(min(5, n)))
    inputs = ds.select(sample)[input_column] if sample and input_column != C.IMAGE else [None] * len(sample)
    ids = ds.select(sample)[C.ID] if sample else []
    return {
        "rows": n,
        "rows_with_new_captions": rows_with,
        "rows_without_input": missing,
        "captions_generated": len(flat),
        "empty_outputs_dropped": (n - missing) * k - len(flat),
        "mean_words": round(float(np.mean([len(t.split()) for t in flat])), 2) if flat else 0.0,
        "distinct_per_row_mean": round(float(np.mean(distinct_per_row)), 3) if distinct_per_row else 0.0,
        "distinct_fraction_overall": round(len(set(flat)) / len(flat), 4) if flat else 0.0,
        "examples": [
            {"id": i, **({"input": x} if x is not None else {}), "generated": generated[r]}
            for r, (i, x) in enumerate(zip(ids, inputs))
        ],
    }


@dataclass
class Job:
    """What one recaption run computes and where: the input, the model, this process's share, OUT.partial."""

    src: LoadedDataset
    out: Path
    input_column: str  # the image column, or with --paraphrase the text column
    info: dict  # inspect_model's
    examples: tuple  # --paraphrase's (input, output) examples
    dist: Dist
    settings: dict  # config.settings(): the generation settings resolved
    num_shards: int
    work: WorkDir

    def record(self, config: RecaptionConfig) -> dict:
        """job.json: what the shards in OUT.partial were computed from (a different job is refused)."""
        src = self.src
        return {
            "command": "recaption",
            "input": {"path": str(src.path), "split": src.split, "where": src.where, "fingerprint": src.fingerprint,
                      "rows": src.rows},
            "model": {k: self.info[k] for k in ("path", "model_type", "fingerprint")},
            "generation": self.settings,
            "examples": [list(p) for p in self.examples],
            "shard_size": config.shard_size,
            "num_shards": self.num_shards,
        }


@computes
def recaption(
    data: str,
    out,
    config: RecaptionConfig,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    overwrite: bool = False,
    process_index: int | None = None,
    num_processes: int | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Generate captions (or paraphrases) for every row of `data`, resumably, and write OUT atomically.

    Returns the `vltool.json` record, or, when this process does not write OUT (not process 0, stopped by
    --max-shards, other processes' shards missing), a status with "finished": False.
    `process_index` / `num_processes` run one process's share by hand (as `accelerate launch` would).
    Stages: load_input -> plan_job -> WorkDir.open -> run_shards -> wait_for_shards -> read_generated -> write_output.
    """
    log = log or console_log
    timer = provenance.Timer()
    config.validate()
    if config.restart and (num_processes or process_state().num_processes) > 1:
        raise UsageError("--restart with several processes is not supported: delete OUT.partial and relaunch")
    src, out = load_input(data, out, config, where, split, overwrite)
    job = plan_job(src, out, config, process_index, num_processes)
    with shards_kept_when_full(job.work.root, out):
        return _run_job(job, data, config, timer, overwrite, log)


@contextlib.contextmanager
def shards_kept_when_full(work_root: Path, out: Path):
    """A full disk while the shards or OUT are written: one line saying so (DiskFull), and that the finished
    shards stay in OUT.partial for a rerun (nothing computed is lost; OUT, and an earlier OUT, untouched)."""
    try:
        yield
    except Exception as e:
        if not isinstance(e, DiskFull) and (isinstance(e, VltoolError) or disk_full_cause(e) is None):
            raise
        done = len(list((work_root / "shards").glob("*.json"))) if (work_root / "shards").is_dir() else 0
        if not done:  # nothing worth resuming: no OUT.partial left beside OUT
            shutil.rmtree(work_root, ignore_errors=True)
        raise DiskFull(disk_full_message(
            out, f"the {done} finished shard(s) are kept in {work_root}: free some space and rerun the same command to "
                 "continue from them" if done else "free some space there or choose another --out")) from e


def _run_job(job: Job, data: str, config: RecaptionConfig, timer, overwrite: bool, log) -> dict:
    """recaption's work once the job is planned: the shards not done yet, then OUT."""
    src = job.src
    work, dist, num_shards = job.work, job.dist, job.num_shards
    made = not work.root.exists()
    done_before = work.open(job.record(config), config.restart)
    if done_before:
        log(f"{config.mode}: resuming: {done_before} of {num_shards} shards already done in {work.root}")
    todo = [i for i in range(num_shards) if i % dist.world == dist.rank and not work.done(i)]  # this process's share, not done
    try:
        run = run_shards(src.dataset, work, todo, src.rows, config, lambda: load_generator(job.info, config, dist.device),
                         job.input_column, dist, log)
    except VltoolError:
        if made and dist.world == 1 and not any(work.shards.glob("*.json")):  # nothing done (the model did not load): no OUT.partial left
            shutil.rmtree(work.root, ignore_errors=True)
        raise
    status = {"finished": False, "work_dir": str(work.root), "num_shards": num_shards, "process_index": dist.rank,
              "num_processes": dist.world, "shards_done_before": done_before, **run}
    if dist.rank != 0:
        log(f"{config.mode}: process {dist.rank}: share done; process 0 merges")
        return status
    missing = wait_for_shards(work, num_shards, config, dist, log)
    if missing:
        log(f"{config.mode}: {num_shards - len(missing)} of {num_shards} shards done; rerun the same command to continue")
        return {**status, "shards_missing": len(missing)}
    generated = read_generated(job, config, data, run)
    prov = write_output(job, generated, config, run, done_before, timer, overwrite)
    return {**prov, "finished": True}


def load_input(data: str, out, config: RecaptionConfig, where: Sequence[str], split: str | None, overwrite: bool) -> tuple[LoadedDataset, Path]:
    """Load the data and check it before any work: the input column (images with one that decodes, or with
    --paraphrase texts with one that is not blank), the existing text columns the new captions join, and --out."""
    input_column = config.text_column if config.paraphrase else C.IMAGE
    src = load_dataset(data, split=split, where=where, required=[C.ID],
                       **({"texts": [input_column]} if config.paraphrase else {"images": [input_column]}))
    if config.paraphrase:
        require_texts(sum(clean_text(t) is not None for t in src.dataset[input_column]), src.rows, input_column, data)
    # the existing texts the new captions join (checked before the work, not when writing after it)
    for column, lists in ((C.CAPTION, False), (C.CAPTIONS, True)):
        if column in src.dataset.column_names and (column != input_column or not config.paraphrase):
            text_column(src.dataset, column, data, option="the existing text column", list_only=lists)
    out = check_output(out, overwrite, inputs=[*src.reads, *[Path(f) for f in (config.model, config.lm, config.examples) if f]])
    if not config.paraphrase:
        require_a_decodable_image(src.dataset.select_columns([input_column]), input_column, data)
    return src, out


def plan_job(src: LoadedDataset, out: Path, config: RecaptionConfig, process_index: int | None, num_processes: int | None) -> Job:
    """The model (inspected, not loaded), the paraphrase examples, this process's rank and device, the shards."""
    info = inspect_model(config.model_path, config.paraphrase)
    examples = load_examples(config.examples) if config.paraphrase else ()
    dist = distributed(config, process_index, num_processes)
    input_column = config.text_column if config.paraphrase else C.IMAGE
    return Job(src, out, input_column, info, examples, dist, config.settings(), -(-src.rows // config.shard_size), WorkDir(work_dir_for(out)))


def wait_for_shards(work: WorkDir, num_shards: int, config: RecaptionConfig, dist: Dist, log: Callable[[str], None]) -> list[int]:
    """The shards still missing: under several processes (without --max-shards) none, once the others
    have written theirs; otherwise those a rerun has to do."""
    missing = [i for i in range(num_shards) if not work.done(i)]
    if missing and config.max_shards is None and dist.world > 1:
        log(f"{config.mode}: waiting for {len(missing)} shard(s) from the other processes")
        while missing:
            time.sleep(2.0)
            missing = [i for i in missing if not work.done(i)]
    return missing


def read_generated(job: Job, config: RecaptionConfig, data: str, run: dict) -> list[list[str]]:
    """Every row's new captions, read back from the shards; no new caption at all is an error (and the
    shards, holding nothing worth resuming, are removed)."""
    ds, n, input_column = job.src.dataset, job.src.rows, job.input_column
    ids = ds[C.ID]
    generated: list[list[str]] = []
    for i in range(job.num_shards):
        lo, hi = i * config.shard_size, min(n, (i + 1) * config.shard_size)
        generated.extend(job.work.read(i, ids[lo:hi]))
    if not any(generated):  # (the shards hold nothing worth resuming)
        shutil.rmtree(job.work.root, ignore_errors=True)
        raise VltoolError(
            f"no row of {data!r} got a new caption ({n:,} rows; {run.get('bad_images', 0):,} undecodable images, "
            f"{int(sum(not _has_input(x) for x in ds[input_column])) if input_column != C.IMAGE else 0:,} empty texts); nothing was written"
        )
    return generated


def write_output(job: Job, generated: list[list[str]], config: RecaptionConfig, run: dict, done_before: int, timer: provenance.Timer,
                 overwrite: bool) -> dict:
    """The input with the new captions (assemble), written to OUT with its record; OUT.partial removed."""
    ds, dist = job.src.dataset, job.dist
    label = source_label(config, job.info)
    out_ds = assemble(ds, generated, config, label)
    stats = {
        **generation_stats(ds, generated, config, job.input_column),
        "caption_source_label": label,
        "generation": job.settings,
        "model": job.info,
        "device": dist.device,
        "dtype": str(resolve_dtype(config.precision, dist.device, job.info.get("path"))).replace("torch.", ""),
        "num_processes": dist.world,
        "shards": job.num_shards,
        "shards_done_before_this_run": done_before,
        "shards_run_by_process_0": run["shards_run"],
        "rows_per_second_process_0": run.get("rows_per_second"),
        "bad_images_this_run_process_0": run.get("bad_images", 0),  # undecodable: no new captions for them
    }
    options = {**provenance.jsonable(config), "resolved": job.settings}
    prov = provenance.make("recaption", options, [job.src, job.info], rows_in=job.src.rows, rows_out=len(out_ds), stats=stats, timer=timer)
    save_dataset(out_ds, job.out, prov, overwrite=overwrite)
    shutil.rmtree(job.work.root, ignore_errors=True)
    prov["wall_time_s"] = round(timer.seconds, 3)
    return prov
