"""The Typer layer: one module per subcommand, each turning options into a config and one library call.

Modules here import only typer, the config dataclasses and the shared options; heavy imports
(torch, datasets, transformers) happen inside the command functions.

`TABLE` is the command table, in the order `vltool --help` lists it: each command's module and its one-line
help. vltool.cli lists the commands from it and imports a command's module only to run (or describe) that
command, so `vltool --help`, `--version` and every command start without the other commands' modules.
"""

TABLE: dict[str, tuple[str, str]] = {  # command -> (module in vltool.commands, one-line help)
    "deform": ("deform", "Captions to bags of words (Fistful of Words, 2.2)."),
    "import": ("import_", "Read CSV/TSV/JSONL/Parquet, WebDataset, image folders, COCO, CLIP_benchmark's datasets."),
    "export": ("export", "Write WebDataset shards or open_clip CSV; a model in transformers' layout."),
    "info": ("info", "Describe a dataset or model and its provenance."),
    "pretrain": ("pretrain", "Train a two-tower model: CLIP, sigmoid, UniCL, JSD, memory bank or SimCLR."),
    "recaption": ("recaption", "New captions from a captioner, or paraphrases from an LM."),
    "filter": ("filter", "Keep reference-like captions (bag-of-n-grams classifier)."),
    "zeroshot": ("zeroshot", "Zero-shot classification with prompt templates."),
    "retrieve": ("retrieve", "Image-text retrieval: Recall@K and ranks."),
    "probe": ("probe", "Linear probe on frozen image features."),
    "mine-positives": ("mine_positives", "False-negative repair: FFF's positive mining."),
    "pseudolabel": ("pseudolabel", "Pseudo bag-of-words captions for unaligned images."),
    "debias": ("debias", "Remove a concept subspace (CLIP-Lite) and measure the edit."),
    "split": ("split", "Assign rows to named parts, by group (e.g. aligned/unaligned)."),
    "report": ("report", "Tabulate a recipe's runs over seeds (JSON, Markdown, PNG)."),
    "pick-caption": ("pick_caption", "One caption per image from a list column (CLIP's single caption)."),
    "benchmark": ("benchmark", "Zero-shot, retrieval and linear probe over many datasets: one table."),
    "evaluate": ("evaluate", "Several zeroshot, retrieve and probe commands in one process."),
    "check-study": ("check_study", "Check a study's variables before its first expensive step."),
}


def short_help(command: str) -> str:
    """The one-line help of `command` (its line of TABLE)."""
    return TABLE[command][1]


def click_exceptions():
    """The click exceptions typer raises (typer >= 0.24 carries its own click)."""
    import typer.core

    exceptions = getattr(typer.core, "_click", None)
    return exceptions.exceptions if exceptions is not None else __import__("click").exceptions
