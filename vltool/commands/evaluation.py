"""Options shared by the evaluation commands (zeroshot, retrieve, probe), spelled once. Not a command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vltool.console import print_json
from vltool.commands.common import NoProgressOpt  # noqa: F401  (shared by every command; re-exported)

EVAL_PANEL = "Evaluation"

EvalModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        help="The model: a vltool RUN_DIR (or RUN_DIR/model) from `vltool pretrain`; hf:ORG/NAME[@REVISION] or hf:DIR (a "
        "Hugging Face CLIPModel or SiglipModel on the Hub or saved with save_pretrained, with its processor); "
        "open_clip:ARCH/TAG (open_clip's pretrained tag, e.g. open_clip:ViT-B-32/laion2b_s34b_b79k), open_clip:ARCH/FILE, "
        "open_clip:hf-hub:ORG/NAME, or local-dir:PATH (open_clip's local-dir layout). Hub files come through "
        "huggingface_hub's cache (HF_HOME; HF_HUB_OFFLINE=1 reads only the cache); the output names the commit.",
        show_default=False,
    ),
]
PretrainedOpt = Annotated[
    Optional[str], typer.Option("--pretrained", help="For --model open_clip:ARCH: an open_clip pretrained tag or a local weights file (as open_clip's own --pretrained).")
]
def _check_bootstrap(value: int) -> int:
    """--bootstrap: at most vltool.metrics.MAX_BOOTSTRAP resamples, refused before any work (a usage error)."""
    from vltool.metrics import resamples_problem  # (numpy: loaded when a command runs, not for --help)

    problem = resamples_problem(value) if value is not None else None
    if problem:
        raise typer.BadParameter(problem)
    return value


BootstrapOpt = Annotated[
    int, typer.Option("--bootstrap", min=0, callback=_check_bootstrap, rich_help_panel=EVAL_PANEL,
                      help="Bootstrap resamples for the 95% intervals (0: none; at most 1,000,000).")
]
ResultsOutOpt = Annotated[
    Optional[Path], typer.Option("--out", "-o", help="Write the results JSON (metrics, intervals, chance, protocol, provenance) here.")
]
EncodeBatchOpt = Annotated[Optional[int], typer.Option("--batch-size", min=1, show_default=False,
                                                       help="Images per encoding batch [default: 64 on CPU, 256 on a GPU].")]
EncodePrecisionOpt = Annotated[str, typer.Option("--precision", help="no | bf16 | fp16: encode in float32 (no: the exact path, equal to the model's own library) or under autocast (faster on a GPU; its embeddings are cached apart).")]
DebiasOpt = Annotated[
    Optional[Path],
    typer.Option("--debias", help="A concept subspace from `vltool debias --out`: remove it from the image embeddings.", rich_help_panel=EVAL_PANEL),
]
DebiasTextOpt = Annotated[bool, typer.Option("--debias-text", help="With --debias: edit the text embeddings too.", rich_help_panel=EVAL_PANEL)]
GroupColumnOpt = Annotated[
    Optional[str],
    typer.Option(
        "--group-column",
        help="The group of each row (e.g. base_id: the skin tones and forms of one emoji): the bootstrap resamples "
        "whole groups, within their class when each group lies in one, and the per-example outcomes record it "
        "[default: each image is its own unit].",
        rich_help_panel=EVAL_PANEL,
    ),
]


def emit(record: dict, title: str, as_json: bool) -> None:
    """The results on stdout: JSON, or the table (on the main process only under accelerate)."""
    # vltool.evaluation (datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.evaluation import is_main, print_table

    if not is_main():
        return
    if as_json:
        print_json(record)
        return
    print_table(record, title)
