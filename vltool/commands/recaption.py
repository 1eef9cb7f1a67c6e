"""`vltool recaption`: the Typer layer. The work is vltool.recaption.recaption."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from vltool.commands import short_help
from vltool.commands.common import (
    NoProgressOpt,
    OldDtypeOpt,
    ThreadsOpt,
    DataArg,
    JsonOpt,
    OldColumnOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SplitOpt,
    WhereOpt,
    handle_errors,
    renamed,
)
from vltool.console import out as stdout, print_json

HELP = """New captions for every row: re-caption the images with a captioning model, or paraphrase the
captions with a language model (Santurkar et al., sections 3.2, 3.3, 4, appendices A.5, A.8; FFF 4.2).

Every model is a local directory (save_pretrained); nothing is downloaded.

Captioner (--model): any image-to-text model transformers loads with AutoModelForImageTextToText and
AutoProcessor (BLIP, BLIP-2, ...). --strategy nucleus samples each caption with its own seed (top-p 0.9,
repetition penalty 1.1, 5 to 40 new tokens: the paper's settings); --strategy beam keeps the k best
beams (FFF). --prompt "a picture of" makes conditional captions (the prompt is stripped unless
--keep-prompt).

Paraphraser (--paraphrase --lm): a causal LM is prompted with four (caption, paraphrase) pairs in the
paper's format ("Paraphrase the sentence below / Input: ... / Output: ..."; --examples FILE replaces
them) and samples with temperature 0.8 until the end of the output line.

Output: `captions` gets the new texts after the existing ones (--replace: new ones only); `caption`
becomes the first new text with --set-caption; `caption_source` {caption, captions} says where each
text came from ("original", or "recaption:nucleus:MODEL_DIR_NAME", ...).

Work is written in shards to OUT.partial as it finishes; rerunning the same command after Ctrl-C, a kill
or a crash continues where it stopped. Under `accelerate launch` each process captions its share and
process 0 merges.

Examples:

  vltool recaption emoji --out emoji_blip --model ./blip-base --num-captions 5 --where split=train

  vltool recaption data --out data_fff --model ./blip2-opt --strategy beam --num-captions 5 --set-caption

  vltool recaption data --out data_para --paraphrase --lm ./gpt-j --num-captions 5

  accelerate launch --multi_gpu --num_processes 4 -m vltool recaption data --out data_blip --model ./blip-base
"""


def recaption_command(
    ctx: typer.Context,
    data: DataArg,
    out: OutOpt,
    model: Annotated[Optional[Path], typer.Option(
        "--model", help="An image captioner (BLIP, BLIP-2, ...): a local directory, or hf:ORG/NAME[@REVISION] from the Hugging Face Hub (through its cache).")] = None,
    paraphrase: Annotated[bool, typer.Option("--paraphrase", help="Paraphrase each row's text with --lm instead of captioning images.")] = False,
    lm: Annotated[Optional[Path], typer.Option("--lm", help="A causal (or seq2seq) language model (with --paraphrase): a local directory, or hf:ORG/NAME[@REVISION].")] = None,
    examples: Annotated[Optional[Path], typer.Option("--examples", help='JSON file of [input, output] pairs for the paraphrase prompt [default: the paper\'s four].')] = None,
    text_column: Annotated[str, typer.Option("--text-column", help="The text column paraphrased (with --paraphrase).")] = "caption",
    num_captions: Annotated[int, typer.Option("--num-captions", min=1, help="New captions (or paraphrases) per row.")] = 5,
    strategy: Annotated[str, typer.Option("--strategy", help="nucleus: sampling, one seed per caption (Santurkar); beam: k best beams (FFF).")] = "nucleus",
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus mass [default: 0.9; 1.0 (temperature only) with --paraphrase].")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="Sampling temperature [default: 1.0; 0.8 with --paraphrase].")] = None,
    repetition_penalty: Annotated[Optional[float], typer.Option("--repetition-penalty", help="[default: 1.1 for nucleus captioning, else 1.0].")] = None,
    min_new_tokens: Annotated[Optional[int], typer.Option("--min-new-tokens", help="Shortest output in tokens [default: 5; 1 with --paraphrase].")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Longest output in tokens.")] = 40,
    num_beams: Annotated[Optional[int], typer.Option("--num-beams", help="Beam width with --strategy beam [default: --num-captions].")] = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", help='Text the captions continue (conditional captioning), e.g. "a picture of".')] = None,
    keep_prompt: Annotated[bool, typer.Option("--keep-prompt", help="Keep --prompt at the start of each caption.")] = False,
    replace: Annotated[bool, typer.Option("--replace", help="captions = the new texts only (drop the existing ones).")] = False,
    set_caption: Annotated[bool, typer.Option("--set-caption", help="caption = the row's first new text.")] = False,
    shard_size: Annotated[int, typer.Option("--shard-size", min=1, help="Rows per checkpoint shard (part of the job: a resumed run keeps it).")] = 1024,
    max_shards: Annotated[Optional[int], typer.Option("--max-shards", min=1, help="Stop after this many new shards; rerun to continue.")] = None,
    restart: Annotated[bool, typer.Option("--restart", help="Discard unfinished work in OUT.partial instead of resuming.")] = False,
    device: Annotated[str, typer.Option("--device", help="auto (cuda if available; under accelerate, the process's device), cpu, cuda, cuda:N or mps.")] = "auto",
    precision: Annotated[str, typer.Option("--precision", help="auto | no | bf16 | fp16: the dtype of the model's weights (no: float32). auto: float32 on cpu; on cuda the model's own bfloat16/float16 when saved so, else bf16 where the GPU computes it, else float32.")] = "auto",
    threads: ThreadsOpt = None,
    where: WhereOpt = None,
    split: SplitOpt = None,
    seed: SeedOpt = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Rows per generate call (each expands to --num-captions sequences).")] = 32,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    column: OldColumnOpt = None,
    old_dtype: OldDtypeOpt = None,
    no_progress: NoProgressOpt = False,
) -> None:
    """One parameter per option (Typer reads them from the signature); the body: options -> config -> recaption -> print_result."""
    # vltool.recaption (datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.recaption import OLD_DTYPES, RecaptionConfig, recaption

    text_column = renamed(ctx, "--column", "--text-column", column, text_column)
    precision = renamed(ctx, "--dtype", "--precision", OLD_DTYPES.get(old_dtype, old_dtype), precision)
    options = locals()
    # every RecaptionConfig field is the option of the same name (tests/test_options.py keeps them in step)
    config = RecaptionConfig(**{f.name: options[f.name] for f in fields(RecaptionConfig)})
    result = recaption(data, out, config, where=where or [], split=split, overwrite=overwrite)
    print_result(result, out, as_json)


def print_result(result: dict, out, as_json: bool) -> None:
    """A finished run's statistics (a table, or JSON with --json); an unfinished one's status with --json only."""
    if not result.get("finished"):
        if as_json:
            print_json(result)
        return
    if as_json:
        print_json(result["stats"] | {"out": str(out)})
    else:
        print_stats(result["stats"], out)


def print_stats(s: dict, out) -> None:
    g = s["generation"]
    t = Table(title=f"{g['mode']} ({g['strategy']}, k={g['num_captions']}) -> {out}")
    t.add_column("statistic")
    t.add_column("value", justify="right")
    rows = [
        ("model", f"{s['model']['name']} ({', '.join(s['model']['architectures']) or s['model']['model_type']})"),
        ("rows", f"{s['rows']:,}"),
        ("rows with new captions", f"{s['rows_with_new_captions']:,}"),
        ("rows without input", f"{s['rows_without_input']:,}"),
        ("captions generated", f"{s['captions_generated']:,}"),
        ("empty outputs dropped", f"{s['empty_outputs_dropped']:,}"),
        ("mean words per caption", f"{s['mean_words']:.2f}"),
        ("distinct captions per row (mean)", f"{s['distinct_per_row_mean']:.2f}"),
        ("shards (done before this run)", f"{s['shards']} ({s['shards_done_before_this_run']})"),
        ("processes", str(s["num_processes"])),
        ("rows/s (process 0)", "-" if s["rows_per_second_process_0"] is None else f"{s['rows_per_second_process_0']:.1f}"),
        ("caption_source label", s["caption_source_label"]),
    ]
    for k, v in rows:
        t.add_row(k, v)
    stdout.print(t)
    for ex in s["examples"][:3]:
        head = f"{ex['id']}" + (f" ({ex['input']!r})" if "input" in ex else "")
        stdout.print(f"{head}: " + " | ".join(ex["generated"]), highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("recaption", help=HELP, short_help=short_help("recaption"))(
        handle_errors(recaption_command)
    )
