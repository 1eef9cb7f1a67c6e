"""vltool.open_clip_parts: open_clip's towers and tokenizer without its package __init__, built exactly
as open_clip.model's builders build them."""

import json
import subprocess
import sys

import pytest
import torch

from vltool.model.configs import CONFIGS_DIR
from vltool.open_clip_parts import build_text_tower, build_vision_tower

CONFIGS = sorted(p.stem for p in CONFIGS_DIR.glob("*.json"))


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("quick_gelu", [False, True])
def test_towers_equal_open_clips_builders(name, quick_gelu):
    from open_clip.model import _build_text_tower, _build_vision_tower

    cfg = json.loads((CONFIGS_DIR / f"{name}.json").read_text())
    d = cfg["embed_dim"]
    for ours, theirs, sub, x in (
        (build_vision_tower, _build_vision_tower, cfg["vision_cfg"], torch.randn(2, 3, cfg["vision_cfg"]["image_size"], cfg["vision_cfg"]["image_size"])),
        (build_text_tower, _build_text_tower, cfg["text_cfg"], torch.randint(0, 400, (2, cfg["text_cfg"].get("context_length", 77)))),
    ):
        torch.manual_seed(0)
        a = ours(d, dict(sub), quick_gelu)
        torch.manual_seed(0)
        b = theirs(d, dict(sub), quick_gelu, None)
        assert type(a) is type(b) and repr(a) == repr(b)
        sa, sb = a.state_dict(), b.state_dict()
        assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)  # the same init, draw for draw
        a.eval(), b.eval()
        with torch.no_grad():
            assert torch.equal(a(x), b(x))


def test_a_config_beyond_the_plain_keys_goes_to_open_clips_builder():
    from open_clip.model import _build_vision_tower

    cfg = {"image_size": 32, "layers": 1, "width": 64, "head_width": 32, "patch_size": 8, "ls_init_value": 0.1}
    torch.manual_seed(0)
    a = build_vision_tower(16, cfg, False)
    torch.manual_seed(0)
    b = _build_vision_tower(16, cfg, False, None)
    assert repr(a) == repr(b) and "ls_1" in dict(a.named_modules())["transformer.resblocks.0"]._modules


def test_loading_a_vltool_model_leaves_open_clip_importable(tmp_path):
    """In a fresh interpreter: a vltool-tiny model is built, its texts tokenised, without open_clip's __init__,
    and `import open_clip` afterwards is the whole package, sharing the same classes."""
    code = (
        "import sys, torch\n"
        "from vltool.open_clip_parts import part, build_vision_tower\n"
        "t = build_vision_tower(8, {'image_size': 16, 'layers': 1, 'width': 32, 'head_width': 16, 'patch_size': 8}, False)\n"
        "tok = part('tokenizer').SimpleTokenizer()\n"
        "heavy = sorted(m for m in ('open_clip.factory', 'transformers', 'timm') if m in sys.modules)\n"
        "import open_clip\n"
        "ok = callable(open_clip.create_model) and open_clip.transformer.VisionTransformer is type(t) and 'open_clip.factory' in sys.modules\n"
        "print(heavy, ok, tok('a cat').shape[-1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["[]", "True", "77"], out.stderr[-2000:]
