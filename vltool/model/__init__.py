"""vltool's model: two towers, their projections into one embedding, and a logit scale.

The model directory (`RUN_DIR/model/`) holds:
- `config.json`     everything needed to rebuild the model (towers, projections, embedding size, logit
                    scale, image size and normalisation, tokenizer), see `docs/pretrain.md`;
- `model.safetensors` the weights (no pickle anywhere);
- `tokenizer/`      the tokenizer files themselves (copied in, never a path into site-packages).

Towers:
- `open_clip`   a vision or text tower of open_clip, built from its config (`vision_cfg` / `text_cfg`);
                its output projection is part of the tower, as in open_clip.
- `torchvision` a torchvision classification network with its last linear layer removed (the trunk),
                followed by a linear projection (`image_proj`).
- `hf`          a Hugging Face encoder read from a local directory, pooled (`mean` over the attention
                mask, or `cls`), followed by a linear projection (`text_proj`).
- `hf_dual`     both towers of a Hugging Face `CLIPModel` or `SiglipModel` (`--model hf:DIR`, `--init hf:DIR`):
                its vision / text model and CLIP's projections (SigLIP's heads), its logit scale and bias,
                its own image processor and tokenizer; `export_hf` writes it back in transformers' layout.

With two open_clip towers the state dict has exactly the keys of open_clip's `CustomTextCLIP`
(`visual.*`, `text.*`, `logit_scale`), which is what makes the `local-dir:` export a plain copy.

Public API (every command loads models through `load_model`):

    m = load_model(spec, pretrained=None, device="cpu")
    m.encode_image(m.preprocess(pil)[None])   # (1, D), L2-normalised
    m.encode_text(m.tokenize(["a cat"]))      # (1, D), L2-normalised

The package, one concern a module, each importing only from the modules above it in this list (no cycle;
tests/test_layering.py checks it):

    format.py             the model directory's files, the format version, what every config shares
    checkpointing.py      gradient checkpointing of a tower's blocks
    torchvision_tower.py  the torchvision image tower (`--image-tower torchvision:NAME`)
    hf_towers.py          the Hugging Face towers: a text encoder (`--text-tower hf:DIR`), a CLIPModel's / SiglipModel's two
    architecture.py       `TwoTower` and CLIP-Lite's critic head (`CriticProjection`)
    tokenizer.py          `Tokenizer`, `OpenClipTokenizer`, the tokenizer files' digest
    pinning.py            the weight fingerprint, a Hub id pinned to its commit
    configs.py            architectures by name (vltool/configs/*.json, open_clip's), an open_clip config as vltool's
    create.py             a new model for `pretrain` (`ModelSpec`, `create_model`)
    model_dir.py          the vltool model directory: found, written (`save_model`), read (`read_model_dir`)
    open_clip_source.py   open_clip:ARCH/TAG, open_clip:hf-hub:, local-dir:, and open_clip's own model (`OpenClipModel`)
    hf_source.py          hf:DIR and hf:ORG/NAME: a Hugging Face CLIP / SigLIP with its processor and tokenizer
    export.py             export to open_clip's local-dir layout and to transformers'
    load.py               any spelling -> a model: `build_from_spec`, `load_model`, `check_init`

This __init__ re-exports every public name, so `from vltool.model import load_model` (and any other) works;
the modules inside the package import from one another, never from here.

open_clip, transformers and torchvision (and vltool.transforms, which imports open_clip) are imported inside the
functions that build or export towers: reading a RUN_DIR's config or fingerprint (a cached evaluation, an export)
never needs them, and importing them costs seconds. torch is imported at module level (as before the split):
`vltool --help` never imports vltool.model.
"""

from __future__ import annotations

from vltool.model.format import (CONFIG_FILE, FORMAT, FORMAT_VERSION, IMAGENET_MEAN, IMAGENET_STD, LOGIT_SCALE_MAX, MODEL_DIR,
                                 OPEN_CLIP_CONFIG, OPEN_CLIP_DIR, OPEN_CLIP_WEIGHTS, OPENAI_MEAN, OPENAI_STD, TEXT_POOLINGS, TOKENIZER_DIR,
                                 WEIGHTS_FILE)
from vltool.model.checkpointing import batchnorm_stats_kept, CheckpointedSequential, set_sequential_checkpointing
from vltool.model.torchvision_tower import MOBILENET_HINT, TorchvisionTower, unknown_torchvision_model
from vltool.model.hf_towers import HF_DUAL, HF_DUAL_TYPES, build_hf_dual, hf_dual_class, HFDualTower, HFTextTower
from vltool.model.architecture import CriticProjection, TwoTower
from vltool.model.tokenizer import (TOKENIZER_FILE_NAMES, OpenClipTokenizer, source_tokenizer, Tokenizer, tokenizer_files_digest,
                                    tokenizer_source)
from vltool.model.pinning import fingerprint, pinned_spec
from vltool.model.configs import CONFIGS_DIR, arch_config, config_from_open_clip, vltool_archs
from vltool.model.create import MINILM_HINT, create_model, ModelSpec, new_model_config
from vltool.model.model_dir import load_weights, read_model_dir, resolve_model_dir, save_model, state_dict_for_save
from vltool.model.open_clip_source import (OPEN_CLIP_SPELLINGS, open_clip_cannot_run, open_clip_native_reasons, open_clip_pretrained_cfg,
                                           open_clip_tag_support, OpenClipModel)
from vltool.model.hf_source import HF_SAVE_HINT, hf_dual_config, hf_dual_dir, hf_preprocess_cfg, hf_processors, load_hf_dual
from vltool.model.export import export_hf, export_open_clip, open_clip_model_cfg
from vltool.model.load import INIT_SPELLINGS, build_from_spec, check_init, load_model, LoadedModel, to_device

__all__ = [
    "CONFIG_FILE",
    "FORMAT",
    "FORMAT_VERSION",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LOGIT_SCALE_MAX",
    "MODEL_DIR",
    "OPEN_CLIP_CONFIG",
    "OPEN_CLIP_DIR",
    "OPEN_CLIP_WEIGHTS",
    "OPENAI_MEAN",
    "OPENAI_STD",
    "TEXT_POOLINGS",
    "TOKENIZER_DIR",
    "WEIGHTS_FILE",
    "batchnorm_stats_kept",
    "CheckpointedSequential",
    "set_sequential_checkpointing",
    "MOBILENET_HINT",
    "TorchvisionTower",
    "unknown_torchvision_model",
    "HF_DUAL",
    "HF_DUAL_TYPES",
    "build_hf_dual",
    "hf_dual_class",
    "HFDualTower",
    "HFTextTower",
    "CriticProjection",
    "TwoTower",
    "TOKENIZER_FILE_NAMES",
    "OpenClipTokenizer",
    "source_tokenizer",
    "Tokenizer",
    "tokenizer_files_digest",
    "tokenizer_source",
    "fingerprint",
    "pinned_spec",
    "CONFIGS_DIR",
    "arch_config",
    "config_from_open_clip",
    "vltool_archs",
    "MINILM_HINT",
    "create_model",
    "ModelSpec",
    "new_model_config",
    "load_weights",
    "read_model_dir",
    "resolve_model_dir",
    "save_model",
    "state_dict_for_save",
    "OPEN_CLIP_SPELLINGS",
    "open_clip_cannot_run",
    "open_clip_native_reasons",
    "open_clip_pretrained_cfg",
    "open_clip_tag_support",
    "OpenClipModel",
    "HF_SAVE_HINT",
    "hf_dual_config",
    "hf_dual_dir",
    "hf_preprocess_cfg",
    "hf_processors",
    "load_hf_dual",
    "export_hf",
    "export_open_clip",
    "open_clip_model_cfg",
    "INIT_SPELLINGS",
    "build_from_spec",
    "check_init",
    "load_model",
    "LoadedModel",
    "to_device",
]
