"""`--format imagefolder`: one sub-folder per class; the folder names (or `--classnames`) are the classes, and
`--caption-template` makes each image's caption."""

from __future__ import annotations

import os
import re
from pathlib import Path

from vltool.errors import UsageError
from vltool.importer.common import ImportConfig, _ChunkWriter, _listdir
from vltool.shards import IMAGE_EXTS


def imagefolder_class_names(folders: list[str], classnames: Path | None) -> list[str]:
    """The class name of each folder: its name with underscores as spaces ("animal_bird" -> "animal bird", the
    words zero-shot prompts read), or line i of --classnames for the i-th folder in sorted order."""
    if classnames is None:
        names = [re.sub(r"\s+", " ", f.replace("_", " ")).strip() or f for f in folders]
        what = "the folder names with underscores as spaces"
    else:
        try:
            names = [line.strip() for line in Path(classnames).expanduser().read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as e:
            raise UsageError(f"--classnames {classnames}: cannot read it ({e.strerror or e})") from None
        if len(names) != len(folders):
            raise UsageError(f"--classnames {classnames}: {len(names)} names for {len(folders)} class folders; "
                             "give one name a line, in the order of the sorted folder names")
        what = f"--classnames {classnames}"
    seen: dict[str, str] = {}
    for f, n in zip(folders, names):
        if n in seen:
            raise UsageError(f"class folders {seen[n]!r} and {f!r} both become the class name {n!r} ({what}); "
                             "give distinct names with --classnames FILE")
        seen[n] = f
    return names


def _scan_imagefolder(root: Path, config: ImportConfig, writer: _ChunkWriter) -> dict:
    classes = [p.name for p in _listdir(root) if p.is_dir()]
    names = imagefolder_class_names(classes, config.classnames)
    ignored = 0
    for cls, name in zip(classes, names):
        label = name if config.classnames is not None else re.sub(r"[_-]+", " ", cls).strip()
        caption = config.caption_template.format(label=label)
        for dirpath, dirnames, filenames in os.walk(root / cls, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fn in sorted(filenames):
                if fn.startswith(".") or fn.rsplit(".", 1)[-1].lower() not in IMAGE_EXTS or "." not in fn:
                    ignored += 1
                    continue
                p = Path(dirpath) / fn
                rel = p.relative_to(root).as_posix()
                writer.add(rel.rsplit(".", 1)[0], rel, str(p), caption, cls)
    writer.flush()
    return {"classes": classes, "names": names, "ignored_files": ignored}
