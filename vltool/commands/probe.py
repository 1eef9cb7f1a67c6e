"""`vltool probe`: the Typer layer. The work is vltool.probe.probe."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vltool.errors import UsageError
from vltool.commands import short_help
from vltool.commands.common import (
    CacheDirOpt, JsonOpt, OldEvalOpt, OldNumProcOpt, OldWorkersOpt, DecodeThreadsOpt, DeviceOpt, ThreadsOpt, decode_threads_option, OverwriteOpt, SeedOpt, SplitOpt, WhereOpt, handle_errors, renamed,
)
from vltool.commands.evaluation import (
    BootstrapOpt, EncodeBatchOpt, EncodePrecisionOpt, EvalModelOpt, DebiasOpt, DebiasTextOpt, GroupColumnOpt, NoProgressOpt, PretrainedOpt, ResultsOutOpt, emit,
)

HELP = """Linear probe: a linear classifier on frozen image features, with the papers' protocols.

--protocol (docs/evaluation.md):
  clip-benchmark  cross-entropy, AdamW lr 0.1, cosine, 10 epochs, batch 64, normalised features after the
                  projection; weight decay chosen on --val-frac of the training rows by CLIP_benchmark's
                  coarse-to-fine log-space search, then refit on train+val.
  santurkar       SGD 250 epochs, batch 256, momentum 0.9, weight decay 1e-6, loss reweighted for class
                  imbalance, learning rate from {0.03 ... 10} chosen on the validation split, 3 seeds,
                  features before the projection (Santurkar et al., A.3).
  fff             AdamW lr 0.1, no weight decay, cosine, 20 epochs on cached features (FFF, A.2).
  voc07-svm       one LinearSVC per class on L2-normalised features before the projection, C in
                  {0.01, 0.1, 1, 10} by 3-fold cross-validation on average precision, positive weight 2;
                  mean average precision (CLIP-Lite / VirTex's VOC07 protocol).

TRAIN_DATA (with --where / --split) trains the probe; --eval-data EVAL_DATA (with --eval-where / --eval-split)
evaluates it. Rows in both are refused. Features go through the embedding cache (--cache-dir).

Examples:

  vltool probe emoji --where split=train --eval-data emoji --eval-where split=test --model runs/tiny

  vltool probe emoji --where split=train --eval-data emoji --eval-where split=test --model runs/tiny --protocol voc07-svm

  vltool probe train_ds --eval-data test_ds --model runs/tiny --protocol clip-benchmark --fewshot-k 16 --out probe.json

  vltool probe emoji --where split=train --eval-data emoji --eval-where split=test --model hf:clip-vit-b32
"""


def probe_command(
    ctx: typer.Context,
    train_data: Annotated[str, typer.Argument(help="Training data: a dataset saved with save_to_disk, or 'emoji'.", show_default=False)],
    model: EvalModelOpt,
    eval_data: Annotated[Optional[str], typer.Option("--eval-data", help="Evaluation data (a dataset directory, or 'emoji'); required.", show_default=False)] = None,
    pretrained: PretrainedOpt = None,
    protocol: Annotated[str, typer.Option("--protocol", help="clip-benchmark | santurkar | fff | voc07-svm.")] = "clip-benchmark",
    features: Annotated[Optional[str], typer.Option("--features", help="pre | post the projection [default: the protocol's].")] = None,
    normalize: Annotated[Optional[bool], typer.Option("--normalize/--no-normalize", help="L2-normalise the features [default: the protocol's].", show_default=False)] = None,
    val_frac: Annotated[float, typer.Option("--val-frac", help="Share of the training rows held out to choose hyper-parameters (weight decay, learning rate).")] = 0.2,
    fewshot_k: Annotated[Optional[int], typer.Option("--fewshot-k", help="Train on k rows per class (sampled with --seed).")] = None,
    label_column: Annotated[Optional[str], typer.Option("--label-column", help="Label column [default: label, else labels (multi-label: voc07-svm only)].")] = None,
    epochs: Annotated[Optional[int], typer.Option("--epochs", help="Override the protocol's epochs (recorded in the results).")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Override the protocol's (or the searched) learning rate (recorded).")] = None,
    bootstrap: BootstrapOpt = 1000,
    seed: SeedOpt = 0,
    where: WhereOpt = None,
    split: SplitOpt = None,
    eval_where: Annotated[Optional[list[str]], typer.Option("--eval-where", help="--where clauses for --eval-data.")] = None,
    eval_split: Annotated[Optional[str], typer.Option("--eval-split", help="Split of --eval-data when it is a DatasetDict.")] = None,
    batch_size: EncodeBatchOpt = None,
    precision: EncodePrecisionOpt = "no",
    decode_threads: DecodeThreadsOpt = None,
    device: DeviceOpt = "auto",
    threads: ThreadsOpt = None,
    cache_dir: CacheDirOpt = None,
    out: ResultsOutOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    group_column: GroupColumnOpt = None,
    debias: DebiasOpt = None,
    debias_text: DebiasTextOpt = False,
    no_progress: NoProgressOpt = False,
    old_eval: OldEvalOpt = None,
    num_proc: OldNumProcOpt = None,
    old_workers: OldWorkersOpt = None,
) -> None:
    # vltool.probe (torch, datasets, sklearn) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.probe import ProbeConfig, probe

    eval_data = renamed(ctx, "--eval", "--eval-data", old_eval, eval_data)
    decode_threads = decode_threads_option(ctx, decode_threads, old_workers, num_proc)
    if eval_data is None:
        raise UsageError("--eval-data is required: the data the probe is evaluated on")
    config = ProbeConfig(
        model=model, pretrained=pretrained, protocol=protocol, features=features, normalize=normalize,
        val_frac=val_frac, fewshot_k=fewshot_k, label_column=label_column, epochs=epochs, lr=lr,
        bootstrap=bootstrap, seed=seed, batch_size=batch_size, precision=precision, decode_threads=decode_threads, device=device, threads=threads,
        cache_dir=str(cache_dir) if cache_dir else None, progress=not no_progress, debias=str(debias) if debias else None, debias_text=debias_text,
        group_column=group_column,
    )
    record = probe(
        train_data, eval_data, config, where=where or [], split=split, eval_where=eval_where or [],
        eval_split=eval_split, out=out, overwrite=overwrite,
    )
    d = record["data"]
    emit(record, f"probe {protocol} ({d['train']['rows']:,} training, {d['eval']['rows']:,} eval images, features {record['protocol']['features']})", as_json)


def register(app: typer.Typer) -> None:
    app.command("probe", help=HELP, short_help=short_help("probe"))(
        handle_errors(probe_command)
    )
