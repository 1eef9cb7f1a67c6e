"""The vltool model directory (`RUN_DIR/model`): found from RUN_DIR or the folder itself, written (config.json,
model.safetensors, the tokenizer files) and read back.
"""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch  # (save_file / load_file through the module: tests replace them)
import torch
from torch import nn

from vltool.checks import read_json
from vltool.errors import UsageError, VltoolError
from vltool.model.architecture import TwoTower
from vltool.model.format import CONFIG_FILE, FORMAT, FORMAT_VERSION, MODEL_DIR, WEIGHTS_FILE
from vltool.model.tokenizer import Tokenizer


def state_dict_for_save(model: TwoTower) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def save_model(model: TwoTower, tokenizer: Tokenizer, out_dir: Path | str) -> Path:
    """Write config.json, model.safetensors and the tokenizer files into `out_dir` (created)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model.config
    safetensors.torch.save_file(state_dict_for_save(model), str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    tokenizer.save(out_dir)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def resolve_model_dir(path: Path | str) -> Path:
    """RUN_DIR or RUN_DIR/model -> the model directory."""
    p = Path(path).expanduser()
    if (p / CONFIG_FILE).is_file() and (p / WEIGHTS_FILE).is_file():
        return p
    if (p / MODEL_DIR / CONFIG_FILE).is_file():
        return p / MODEL_DIR
    if not p.exists():
        raise UsageError(f"model {str(path)!r} does not exist (give a vltool RUN_DIR, RUN_DIR/model, hf:ORG/NAME, hf:DIR, open_clip:ARCH/TAG, open_clip:hf-hub:ORG/NAME or local-dir:PATH)")
    if p.is_file():  # e.g. RUN_DIR/model/config.json: the model is the folder that holds it
        folder = p.parent.parent if p.parent.name == MODEL_DIR and (p.parent.parent / "run.json").is_file() else p.parent
        hint = (f"give its folder: {folder}" if (p.parent / CONFIG_FILE).is_file() and (p.parent / WEIGHTS_FILE).is_file()
                else "give a model folder (a vltool RUN_DIR or RUN_DIR/model)")
        raise UsageError(f"model {str(path)!r} is a file, not a model folder; {hint}")
    incomplete = _incomplete_model(p)
    if incomplete:
        raise UsageError(incomplete)
    if (p / "checkpoints").is_dir():
        raise UsageError(f"{p} is an unfinished training run (no model/ yet); finish it with `vltool pretrain --resume {p}`")
    raise UsageError(f"{p} is not a vltool model (no {CONFIG_FILE} and {WEIGHTS_FILE}, nor {MODEL_DIR}/ holding them)")


def _incomplete_model(p: Path) -> str | None:
    """Why `p` (RUN_DIR or a model directory) holds a model with files missing, or None: a finished run
    (RUN_DIR/vltool.json), or a model directory holding some of its files, is not an unfinished run."""
    model_dir = p / MODEL_DIR if (p / MODEL_DIR).is_dir() or (p / "vltool.json").is_file() else p
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (model_dir / f).is_file()]
    if model_dir == p and len(missing) == 2:  # neither file: not a model at all
        return None
    return (f"{model_dir} is an incomplete model (no {' nor '.join(missing)}): its files were removed or damaged after "
            "it was written; restore them, or train it again")


def load_weights(model: nn.Module, path: Path) -> None:
    state = safetensors.torch.load_file(str(path))
    model.load_state_dict(state, strict=True)


def read_model_dir(model_dir: Path) -> tuple[TwoTower, Tokenizer]:
    """The model and tokenizer of a vltool model directory (on CPU, not yet in eval mode)."""
    config = read_json(model_dir / CONFIG_FILE, "the model config")
    if config.get("format") != FORMAT:
        raise VltoolError(f"{model_dir / CONFIG_FILE} is not a vltool model config (format {config.get('format')!r})")
    if config.get("format_version", 0) > FORMAT_VERSION:
        raise VltoolError(f"{model_dir} was written by a newer vltool (format {config['format_version']}); upgrade vltool")
    model = TwoTower(config)
    try:
        load_weights(model, model_dir / WEIGHTS_FILE)
    except Exception as e:
        raise VltoolError(f"cannot load {model_dir / WEIGHTS_FILE}: {e}") from None
    return model, Tokenizer.from_model_dir(config["tokenizer"], model_dir)
