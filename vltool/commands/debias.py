"""`vltool debias`: the Typer layer. The work is vltool.debias.compute_subspace / vltool.debias.measure."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from vltool import console
from vltool.console import print_json
from vltool.errors import UsageError
from vltool.commands import short_help
from vltool.commands.common import (
    DeviceOpt, ThreadsOpt,
    NoProgressOpt,
    CacheDirOpt, JsonOpt, OldEvalOpt, OverwriteOpt, SeedOpt, SplitOpt, WhereOpt, handle_errors, renamed,
)
from vltool.commands.evaluation import EvalModelOpt, PretrainedOpt

HELP = """Remove a concept (e.g. gender) from the shared embedding space, and measure the edit (CLIP-Lite, 4.8).

Without --subspace: concept pairs (default: 20 gender pairs such as man/woman) go through sentence
templates; the sentences are encoded, each pair centred on its mean, and the top --components
principal components are saved to --out as the subspace V. Evaluation commands then take
`--debias OUT` and edit image embeddings as h - sum_j <h, v_j> v_j, renormalised.

With --subspace and --eval-data: Table 6's measurement. For queries naming one group or the other, the --top
most aligned images of each group of --group-column; the mean alignment of each (query group, image
group) cell before and after the edit, the own-minus-other gap and the change of its size, and the zero-shot
accuracy on --zeroshot-label before and after. --out is then a results JSON.

Examples:

  vltool debias --model runs/tiny --out runs/tiny_gender

  vltool debias --model hf:clip-vit-b32 --out clip_gender

  vltool debias --model runs/tiny --subspace runs/tiny_gender --eval-data emoji --where split=test --group-column gender --out report.json
"""


def debias_command(
    ctx: typer.Context,
    model: EvalModelOpt,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="The subspace directory, or (with --subspace) the report JSON.")] = None,
    pretrained: PretrainedOpt = None,
    pairs: Annotated[Optional[Path], typer.Option("--pairs", help="Concept pairs: two words per line, tab- or comma-separated [default: vltool's 20 gender pairs].")] = None,
    templates: Annotated[Optional[Path], typer.Option("--templates", help="Sentence templates, one per line with {} [default: vltool's].")] = None,
    components: Annotated[int, typer.Option("--components", min=1, help="Principal components kept (CLIP-Lite: 1).")] = 1,
    subspace: Annotated[Optional[Path], typer.Option("--subspace", help="Report mode: the subspace to measure.")] = None,
    eval_data: Annotated[Optional[str], typer.Option("--eval-data", help="Report mode: the dataset of images.")] = None,
    group_column: Annotated[str, typer.Option("--group-column", help="Report mode: the image groups (rows with an empty value are left out).")] = "gender",
    queries: Annotated[Optional[Path], typer.Option("--queries", help="Report mode: GROUP<TAB>QUERY lines [default: the pairs in the templates].")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Report mode: images per query and group.")] = 10,
    debias_text: Annotated[bool, typer.Option("--debias-text", help="Edit the query embeddings too.")] = False,
    zeroshot_label: Annotated[Optional[str], typer.Option("--zeroshot-label", help="Report mode: zero-shot accuracy on this ClassLabel column before/after ('' for none) [default: label, when the data has it].")] = None,
    where: WhereOpt = None,
    split: SplitOpt = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Images per encoding batch.")] = 64,
    cache_dir: CacheDirOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    threads: ThreadsOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    old_eval: OldEvalOpt = None,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.debias (torch, datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.debias import DebiasConfig, compute_subspace, measure

    eval_data = renamed(ctx, "--eval", "--eval-data", old_eval, eval_data)
    config = DebiasConfig(
        model=model, pretrained=pretrained, pairs=str(pairs) if pairs else None, templates=str(templates) if templates else None,
        components=components, subspace=str(subspace) if subspace else None, eval_data=eval_data, group_column=group_column,
        queries=str(queries) if queries else None, top=top, debias_text=debias_text, zeroshot_label=zeroshot_label,
        batch_size=batch_size, cache_dir=str(cache_dir) if cache_dir else None, seed=seed, device=device, threads=threads,
    )
    stdout = console.out
    if subspace is None and eval_data is None:
        if out is None:
            raise UsageError("--out is required: the directory to write the subspace to")
        prov = compute_subspace(config, out, overwrite=overwrite)
        s = prov["stats"]
        if as_json:
            print_json(s)
        else:
            ev = ", ".join(f"{100 * x:.1f}%" for x in s["explained_variance_ratio"])
            stdout.print(f"subspace of {s['components']} component(s) in {s['dim']} dimensions from "
                         f"{s['sentence_pairs']} sentence pairs; variance explained: {ev} -> {out}")
        return
    record = measure(config, out, where=where or [], split=split, overwrite=overwrite)
    s = record["stats"]
    if as_json:
        print_json(record)
        return

    t = Table(title=f"mean alignment of {top_images(s['top_used'])} ({s['group_column']})")
    for col in ("query group", "image group", "before", "after", "change"):
        t.add_column(col, justify="right")
    for gq, row in s["cells"].items():
        for gi, c in row.items():
            t.add_row(gq, gi, f"{c['before']:.4f}", f"{c['after']:.4f}", f"{c['delta']:+.4f}")
    stdout.print(t)
    stdout.print(gap_line(s), highlight=False)
    if "zeroshot" in s:
        z = s["zeroshot"]
        b, a = z["before"], z["after"]
        stdout.print(f"zero-shot top-1 on {z['label']!r}: {100 * b['value']:.2f}% [{100 * b['ci_low']:.2f}, {100 * b['ci_high']:.2f}] -> "
                     f"{100 * a['value']:.2f}% [{100 * a['ci_low']:.2f}, {100 * a['ci_high']:.2f}] (chance {100 * b['chance']:.2f}%)")


def top_images(top_used: dict) -> str:
    """The images each cell averages: "the top 10 images of each group", or per group when a group has
    fewer images than --top (then all of them)."""
    counts = set(top_used.values())
    if len(counts) == 1:
        return f"the top {counts.pop()} images of each group"
    return "the top images of each group (" + ", ".join(f"{g}: {n}" for g, n in top_used.items()) + ")"


def gap_line(s: dict) -> str:
    """The own-minus-other gap before and after, and the change of its size (never 1 - after/before, which
    a sign flip or a gap near 0 makes meaningless)."""
    change = s["abs_gap_change"]
    word = "smaller" if change < 0 else "larger" if change > 0 else "unchanged"
    return (f"own-group minus other-group gap: {s['gap_before']:+.4f} -> {s['gap_after']:+.4f}; its size "
            f"{s['abs_gap_before']:.4f} -> {s['abs_gap_after']:.4f} ({change:+.4f}, {word})")


def register(app: typer.Typer) -> None:
    app.command("debias", help=HELP, short_help=short_help("debias"))(
        handle_errors(debias_command)
    )
