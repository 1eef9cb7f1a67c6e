"""What a run writes as it goes: RUN_DIR/metrics.jsonl (and TensorBoard when installed), the progress bar,
and loss.png at the end."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, ImageDraw
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from vltool.console import err

# TensorBoard and matplotlib are optional: imported where they are used, and the run goes on without them.


class MetricsLog:
    """One JSON line per event in metrics.jsonl, written by the main process only; numeric fields also go to
    TensorBoard (RUN_DIR/tensorboard) when it is installed. A progress bar on stderr when asked."""

    def __init__(self, path: Path, is_main: bool, total_steps: int = 0, start_step: int = 0, progress: bool = False):
        self.path, self.is_main = Path(path), is_main
        self.tb = self.bar = None
        if not is_main:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter  # (optional: see the top)

            self.tb = SummaryWriter(str(self.path.parent / "tensorboard"))
        except Exception:
            self.tb = None
        if progress:
            self.bar = Progress(TextColumn("[bold]pretrain[/] step {task.completed}/{task.total}"), BarColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=err, transient=False)
            self.task = self.bar.add_task("train", total=total_steps, completed=start_step, info="")
            self.bar.start()

    def write(self, obj: dict) -> None:
        if not self.is_main:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(obj) + "\n")
        if self.tb is not None:
            for k, v in obj.items():
                if isinstance(v, (int, float)) and k not in ("step", "kind"):
                    self.tb.add_scalar(k, v, obj["step"])

    def progress(self, step: int, info: str | None = None) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step, **({"info": info} if info is not None else {}))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.tb is not None:
            self.tb.close()

    def read(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines()] if self.path.is_file() else []


def plot_curves(metrics: list[dict], path: Path) -> str:
    """loss.png: training loss (and validation loss) over steps. matplotlib when installed, else PIL."""
    train = [(m["step"], m["loss"]) for m in metrics if "loss" in m and m.get("kind") == "train"]
    val = [(m["step"], m["val_loss"]) for m in metrics if "val_loss" in m]
    if not train:
        return "no points"
    try:
        import matplotlib  # (optional: see the top)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(*zip(*train), label="train loss")
        if val:
            ax.plot(*zip(*val), "o-", label="validation loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return "matplotlib"
    except ImportError:
        pass
    W, H, L, R, T, B = 640, 400, 60, 20, 20, 40
    im = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(im)
    pts = train + val
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def xy(p):
        return L + (p[0] - x0) / (x1 - x0) * (W - L - R), T + (y1 - p[1]) / (y1 - y0) * (H - T - B)

    d.rectangle([L, T, W - R, H - B], outline="black")
    for frac in (0, 0.5, 1):
        yv = y0 + frac * (y1 - y0)
        d.text((4, xy((x0, yv))[1] - 6), f"{yv:.3g}", fill="black")
        xv = x0 + frac * (x1 - x0)
        d.text((xy((xv, y0))[0] - 10, H - B + 6), f"{xv:.0f}", fill="black")
    d.line([xy(p) for p in train], fill=(31, 119, 180), width=2) if len(train) > 1 else None
    if val:
        d.line([xy(p) for p in val], fill=(255, 127, 14), width=2) if len(val) > 1 else None
        for p in val:
            x, y = xy(p)
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=(255, 127, 14))
    d.text((L + 8, T + 6), "train loss", fill=(31, 119, 180))
    if val:
        d.text((L + 8, T + 20), "validation loss", fill=(255, 127, 14))
    d.text((W // 2 - 10, H - 16), "step", fill="black")
    im.save(path)
    return "PIL (matplotlib is not installed)"
