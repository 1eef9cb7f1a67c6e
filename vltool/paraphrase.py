"""The language model's prompt for `vltool recaption --paraphrase`: the in-context query of Santurkar et al.
(appendix A.8) built from (caption, paraphrase) example pairs, and the pairs of `--examples FILE`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from vltool.errors import UsageError

PROMPT_HEADER = "Paraphrase the sentence below"
# Santurkar et al., appendix A.8: the four (caption, paraphrase) pairs of their example query, pairs of
# human-written COCO captions of one image.
DEFAULT_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("A little boy standing next to a dog in a field.",
     "A dog parked filled with people and a bunch of different dogs."),
    ("Some people are on the sandy beach flying kites.",
     "a sunny day at the beach with colorful kites in the sky"),
    ("A living room filled with furniture and a table.",
     "A living room with a nice couch and a coffee table."),
    ("A couple of people on a surfboard in the ocean.",
     "A dog is lying on the surfboard as it surfs on a wave."),
)


def one_line(text: str) -> str:
    """Whitespace (newlines included) collapsed to single spaces: the prompt is line-based."""
    return " ".join(str(text).split())


def paraphrase_prompt(caption: str, examples: Sequence[tuple[str, str]] = DEFAULT_EXAMPLES) -> str:
    """The in-context query of Santurkar et al., appendix A.8: one block per example pair, then the caption.

    The model's paraphrase is what it writes after the final "Output:", up to the end of that line.
    """
    lines = []
    for inp, out in examples:
        lines += [PROMPT_HEADER, f"Input: {one_line(inp)}", f"Output: {one_line(out)}"]
    lines += [PROMPT_HEADER, f"Input: {one_line(caption)}", "Output:"]
    return "\n".join(lines)


def load_examples(path: Path | str | None) -> tuple[tuple[str, str], ...]:
    """--examples FILE: a JSON list of [input, output] pairs or {"input": ..., "output": ...} objects
    (or JSON Lines with one of these per line)."""
    if path is None:
        return DEFAULT_EXAMPLES
    path = Path(path).expanduser()
    text = path.read_text(encoding="utf-8")
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        try:
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise UsageError(f"--examples {path}: not JSON or JSON Lines ({e})") from None
    pairs = []
    for i, item in enumerate(items if isinstance(items, list) else [None]):
        if isinstance(item, dict) and isinstance(item.get("input"), str) and isinstance(item.get("output"), str):
            pairs.append((item["input"], item["output"]))
        elif isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item):
            pairs.append((item[0], item[1]))
        else:
            raise UsageError(
                f"--examples {path}: item {i} is not an [input, output] pair of strings or an "
                '{"input": ..., "output": ...} object'
            )
    if not pairs:
        raise UsageError(f"--examples {path}: no example pairs")
    if any(not one_line(a) or not one_line(b) for a, b in pairs):
        raise UsageError(f"--examples {path}: an example input or output is empty")
    return tuple(pairs)
