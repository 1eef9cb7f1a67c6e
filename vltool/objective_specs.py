"""The training objectives of `vltool pretrain`, declared once: name, help, paper, the options each owns
and their checks.

Torch-free, so that `vltool pretrain --help` stays light: the `--loss` help (commands/pretrain.py), the
config's checks (pretrain/config.py) and docs/objectives.md's table (scripts/options_docs.py) are read from
`SPECS`. Each spec's class in vltool.pretrain.objectives attaches to it with `@objective(NAME)` and holds
the hooks the trainer calls (what it adds to the model, the data it loads, its per-batch inputs, its
bias search, its start record, its statistics); its loss is `vltool.losses.LOSSES[spec.loss]`.

A new objective: its loss in vltool/losses.py (`@register_loss`), its spec here (`register`), its class in
vltool/pretrain/objectives.py (`@objective`), its options as PretrainConfig fields and "Loss" options of
commands/pretrain.py; tests/test_objectives.py names whichever is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from vltool.errors import UsageError


def _opt(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _no_problems(c, chosen: bool) -> list[str]:
    return []


@dataclass(frozen=True)
class ObjectiveSpec:
    """One objective. `check(config, chosen)` returns the problems of its options in `config` (`chosen`:
    this is the run's objective); every spec's check runs for every config, so an option given without
    its objective is refused by the objective that owns it."""

    name: str  # what --loss help and the docs call it (--loss NAME unless `switch` turns it on)
    help: str  # one line: --loss help and the docs' table
    paper: str  # the paper and sections it follows (docs/papers.md)
    example: str  # a command training it on the built-in emoji data (docs/objectives.md)
    options: tuple[str, ...] = ()  # the PretrainConfig fields it owns ("Loss" options of commands/pretrain.py)
    loss: str = ""  # the --loss it trains under (default: its name)
    switch: tuple[str, str] | None = None  # (the owned option that turns it on over plain --loss, its value's name)
    data_options: tuple[str, ...] = ()  # owned options that name training data (DATA may then be left out)
    stats: tuple[str, ...] = ()  # its entries of the run's statistics (None in every other objective's run)
    check: Callable[..., list[str]] = field(default=_no_problems, compare=False)

    def __post_init__(self):
        if not self.loss:
            object.__setattr__(self, "loss", self.name)

    @property
    def selector(self) -> str:
        """The options that select it: `--loss sigmoid`, `--loss clip --memory-bank K`."""
        on = f" {_opt(self.switch[0])} {self.switch[1]}" if self.switch else ""
        return f"--loss {self.loss}{on}"

    def chosen_by(self, config) -> bool:
        if config.loss != self.loss:
            return False
        if self.switch:
            return bool(getattr(config, self.switch[0]))
        return not any(s.switch and getattr(config, s.switch[0]) for s in SPECS.values() if s.loss == self.loss)


SPECS: dict[str, ObjectiveSpec] = {}


def register(spec: ObjectiveSpec) -> ObjectiveSpec:
    if spec.name in SPECS:
        raise ValueError(f"objective {spec.name!r} is declared twice")
    SPECS[spec.name] = spec
    return spec


def losses() -> list[str]:
    """The values --loss takes, in declaration order."""
    return list(dict.fromkeys(s.loss for s in SPECS.values()))


def chosen(config) -> ObjectiveSpec | None:
    """The objective `config` trains (None for an unknown --loss)."""
    return next((s for s in SPECS.values() if s.chosen_by(config)), None)


def problems(config) -> list[str]:
    """Every objective's problems with `config`'s options (config.validate reports them)."""
    out = []
    if config.loss not in losses():
        out.append(f"--loss {config.loss!r}: unknown; available: {', '.join(sorted(losses()))}")
    run = chosen(config)
    for spec in SPECS.values():
        out += spec.check(config, spec is run)
    return out


def gives_data(config) -> bool:
    """Whether `config` names training data through an objective's options (--label-data, --text-data)."""
    return any(getattr(config, name) for s in SPECS.values() for name in s.data_options)


def stat_keys() -> list[str]:
    """The objectives' entries of every run's statistics."""
    return [k for s in SPECS.values() for k in s.stats]


def loss_help() -> str:
    """The help of --loss."""
    plain = " | ".join(f"{s.name} ({s.help})" for s in SPECS.values() if not s.switch)
    switched = "".join(f"; {s.loss} with {_opt(s.switch[0])} {s.switch[1]}: {s.help}" for s in SPECS.values() if s.switch)
    return f"Training objective: {plain}{switched}. See docs/objectives.md."


# ------------------------------------------------------------------------------------------------ the objectives


register(ObjectiveSpec(
    "clip", "InfoNCE", "CLIP (Radford et al. 2021), Figure 3",
    "vltool pretrain emoji --where split=train --out runs/clip --arch vltool-tiny --epochs 5",
))


def _sigmoid_problems(c, chosen: bool) -> list[str]:
    out = []
    if c.bias_init is not None:
        if not chosen:
            out.append("--bias-init is an option of --loss sigmoid")
        elif c.bias_init != "search":
            try:
                float(c.bias_init)
            except ValueError:
                out.append(f"--bias-init must be a number or 'search', got {c.bias_init!r}")
    if c.bias_search_batches < 1:
        out.append(f"--bias-search-batches must be >= 1, got {c.bias_search_batches}")
    if c.captions_per_image < 1:
        out.append(f"--captions-per-image must be >= 1, got {c.captions_per_image}")
    elif c.captions_per_image > 1 and not chosen:
        out.append("--captions-per-image > 1 needs a loss with several positives per image (--loss sigmoid)")
    if c.mined_positives and not chosen:
        out.append("--mined-positives needs --loss sigmoid")
    return out


register(ObjectiveSpec(
    "sigmoid", "FFF/SigLIP, several positives", "FFF: Fixing Flawed Foundations in contrastive pre-training, 4.1-4.4; SigLIP",
    "vltool pretrain emoji --where split=train --out runs/sig --loss sigmoid --captions-per-image 2 --caption-sampling random --bias-init search",
    options=("bias_init", "bias_search_batches", "captions_per_image", "mined_positives"),
    check=_sigmoid_problems,
))


def _unicl_problems(c, chosen: bool) -> list[str]:
    out = []
    if (c.label_data or c.text_data or c.balanced) and not chosen:
        out.append("--label-data, --text-data and --balanced are options of --loss unicl")
    if c.balanced and not c.label_data:
        out.append("--balanced needs --label-data (it draws as many image-text rows as image-label rows)")
    if c.label_data:
        from vltool.templates import load_templates  # (lazy: the templates' modules read the built-in data)

        try:
            load_templates(c.templates)
        except UsageError as e:
            out.append(str(e))
    if chosen and (c.caption_sampling or c.captions_per_image > 1):
        out.append("--loss unicl reads --text-column of --text-data (not --caption-sampling / --captions-per-image)")
    return out


register(ObjectiveSpec(
    "unicl", "label-aware soft targets", "Unified Contrastive Learning in Image-Text-Label Space, 3.2, Algorithm 1, appendix B.2",
    "vltool pretrain --where split=train --out runs/unicl --loss unicl --label-data emoji --text-data emoji --prefix-ids --balanced",
    options=("label_data", "text_data", "label_column", "templates", "balanced"),
    data_options=("label_data", "text_data"),
    check=_unicl_problems,
))


JSD_NEGATIVES = ("one", "all")  # vltool.losses.JSDLoss.NEGATIVES (torch-side; tests/test_objectives.py keeps them equal)


def _jsd_problems(c, chosen: bool) -> list[str]:
    out = []
    if c.critic_dim is not None and (not chosen or c.critic_dim < 1):
        out.append("--critic-dim is an option of --loss jsd and must be >= 1")
    if c.jsd_negatives not in JSD_NEGATIVES:
        out.append(f"--jsd-negatives must be one or all, got {c.jsd_negatives!r}")
    elif c.jsd_negatives != "one" and not chosen:
        out.append("--jsd-negatives is an option of --loss jsd")
    return out


register(ObjectiveSpec(
    "jsd", "CLIP-Lite, one negative per positive, critic projections",
    "CLIP-Lite: Information Efficient Visual Representation Learning with Language Supervision, 3.1, Figure 3",
    "vltool pretrain emoji --where split=train --out runs/jsd --loss jsd",
    options=("critic_dim", "jsd_negatives"),
    check=_jsd_problems,
))


def _simclr_problems(c, chosen: bool) -> list[str]:
    if chosen and c.augment != "simclr":
        return ["--loss simclr contrasts two augmented views: use --augment simclr"]
    return []


register(ObjectiveSpec(
    "simclr", "image-only views, no text", "Is a Caption Worth a Thousand Images?, 2.1, appendix A.3",
    "vltool pretrain emoji --where split=train --out runs/simclr --loss simclr --augment simclr",
    check=_simclr_problems,
))


def _memory_bank_problems(c, chosen: bool) -> list[str]:
    out = []
    if c.memory_bank < 0 or (c.memory_bank and not chosen):
        out.append("--memory-bank K needs --loss clip and K >= 1")
    if not c.temperature > 0:
        out.append(f"--temperature must be > 0, got {c.temperature}")
    if c.ema_momentum is not None and not 0 <= c.ema_momentum < 1:
        out.append(f"--ema-momentum must be in [0, 1), got {c.ema_momentum}")
    if c.ema_momentum is not None and not c.memory_bank:
        out.append("--ema-momentum needs --memory-bank")
    if c.export_ema and not c.memory_bank:
        out.append("--export-ema needs --memory-bank")
    return out


register(ObjectiveSpec(
    "memory-bank", "EMA queue", "A Fistful of Words, 2.1, equations 1-3",
    "vltool pretrain emoji --where split=train --out runs/bank --memory-bank 1024 --optimizer sgd --lr 0.003 --weight-decay 0",
    options=("memory_bank", "temperature", "ema_momentum", "export_ema"),
    loss="clip", switch=("memory_bank", "K"), stats=("ema_momentum",),
    check=_memory_bank_problems,
))
