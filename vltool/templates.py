"""Prompt templates for zero-shot classification, by name or from a file.

Names (files under vltool/assets/templates/, one template per line, `{}` where the class name goes):
- `photo`            "a photo of a {}." (A Fistful of Words' protocol)
- `auto`             the dataset's own templates (`zeroshot_classification_templates.txt` in its directory, as
                     CLIP_benchmark's datasets and their `vltool import` carry), else `photo`
- `openai-imagenet`  CLIP's 80 ImageNet templates (UniCL's validation; FFF's appendix, "ImageNet")
- `fff-cifar`, `fff-food101`, `fff-caltech101`, `fff-cars`, `fff-dtd`, `fff-sun397`, `fff-imagenet`: the
  per-dataset sets of FFF's appendix ("FFF: Fixing Flawed Foundations in contrastive pre-training"), which are CLIP's; `fff-imagenet` is
  `openai-imagenet`. They equal CLIP_benchmark's `en_zeroshot_classification_templates.json` (a test checks).

A template file may also write the place of the class name as `{c}` (CLIP_benchmark) or `{label}` (FFF's
appendix). `--class-prompts FILE` gives prompts per class instead (JSON: class name -> list of prompts,
as CLIP_benchmark's custom templates, e.g. CuPL); classes it does not list use the templates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from vltool.errors import UsageError
from vltool.io.builtin import ASSETS

TEMPLATE_DIR = ASSETS / "templates"
DATASET_TEMPLATES = "zeroshot_classification_templates.txt"  # a dataset's own templates, beside it (CLIP_benchmark's name)
AUTO = "auto"  # --templates auto: the dataset's own, else `photo`
DEFAULT = "photo"
ALIASES = {"fff-imagenet": "openai-imagenet", "fff-cifar10": "fff-cifar", "fff-cifar100": "fff-cifar"}
PLACEHOLDERS = ("{}", "{c}", "{label}")


def template_names() -> list[str]:
    return sorted([p.stem for p in TEMPLATE_DIR.glob("*.txt")] + list(ALIASES))


def parse_templates(lines: Sequence[str], what: str) -> list[str]:
    """Non-empty lines, each with exactly one place for the class name, normalised to `{}`."""
    out, problems = [], []
    for i, line in enumerate(lines, 1):
        t = line.strip()
        if not t or t.startswith("#"):
            continue
        for ph in PLACEHOLDERS[1:]:
            t = t.replace(ph, "{}")
        if t.count("{}") != 1:
            problems.append(f"line {i} ({t!r}) must hold exactly one {{}} where the class name goes")
        out.append(t)
    if problems:
        raise UsageError(f"{what}: " + "; ".join(problems[:5]))
    if not out:
        raise UsageError(f"{what} holds no template")
    return out


def load_templates(spec: str) -> tuple[str, list[str]]:
    """A template set by name, or a file of templates -> (name or path, templates)."""
    name = ALIASES.get(spec, spec)
    path = TEMPLATE_DIR / f"{name}.txt"
    if path.is_file():
        return spec, parse_templates(path.read_text().splitlines(), f"--templates {spec}")
    p = Path(spec).expanduser()
    if p.is_file():
        return str(p), parse_templates(p.read_text().splitlines(), f"--templates {spec}")
    raise UsageError(f"--templates {spec!r}: not a template set ({', '.join(template_names())}) nor a file")


def resolve_templates(spec: str, dataset_dir: Path | str | None) -> tuple[str, list[str]]:
    """`load_templates`, where `auto` is the dataset's own templates when its directory holds
    zeroshot_classification_templates.txt (a CLIP_benchmark dataset and its `vltool import` do), else `photo`."""
    if spec == AUTO:
        own = Path(dataset_dir) / DATASET_TEMPLATES if dataset_dir is not None else None
        if own is not None and own.is_file():
            return str(own), parse_templates(own.read_text().splitlines(), str(own))
        return load_templates(DEFAULT)
    return load_templates(spec)


def fill(template: str, classname: str) -> str:
    return template.replace("{}", classname)


def load_classnames(path: str | Path, expected: int | None) -> list[str]:
    """One class name per line, in class-index order."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--classnames {path}: no such file (one class name per line, in label order)")
    names = [line.strip() for line in p.read_text().splitlines() if line.strip()]
    if expected is not None and len(names) != expected:
        raise UsageError(f"--classnames {path}: holds {len(names)} names, the label column has {expected} classes")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise UsageError(f"--classnames {path}: repeated names {dup[:5]}")
    return names


def load_class_prompts(path: str | Path, classnames: Sequence[str]) -> dict[str, list[str]]:
    """JSON {class name: [prompt, ...]}; every key must be one of `classnames`."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--class-prompts {path}: no such file")
    try:
        obj = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UsageError(f"--class-prompts {path}: not JSON ({e})") from None
    if not isinstance(obj, dict) or not all(isinstance(v, list) and all(isinstance(s, str) for s in v) for v in obj.values()):
        raise UsageError(f"--class-prompts {path}: expected a JSON object {{class name: [prompt, ...]}}")
    known = set(classnames)
    unknown = [k for k in obj if k not in known]
    if unknown:
        raise UsageError(f"--class-prompts {path}: {len(unknown)} names are not classes, e.g. {unknown[:3]} (classes: {list(classnames)[:3]}...)")
    empty = [k for k, v in obj.items() if not [s for s in v if s.strip()]]
    if empty:
        raise UsageError(f"--class-prompts {path}: no prompt for {empty[:3]}")
    return {k: [s for s in v if s.strip()] for k, v in obj.items()}


def class_prompts(classnames: Sequence[str], templates: Sequence[str], custom: dict[str, list[str]] | None = None) -> list[list[str]]:
    """The prompts of each class: its custom prompts when given, else every template filled with its name."""
    custom = custom or {}
    return [list(custom[c]) if c in custom else [fill(t, c) for t in templates] for c in classnames]
