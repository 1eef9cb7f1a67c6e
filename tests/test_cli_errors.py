"""Every command on bad input (vltool.cli's one-line errors): bad input never destroys what a user owns, never prints a traceback, never exits 0 with a meaningless
answer (issue #20; docs/conventions.md, "Bad input").

The sweep runs every command on a shared matrix of bad inputs (a missing path, 0 rows, wrong column
types, empty captions, path strings in the image column, an unwritable --out, --out equal to or inside
an input) and asserts exit code 1 or 2, one line on stderr, no traceback, nothing written, and every
input (the model too) unchanged, hashed file by file before and after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.command_inputs import COMMON, MODEL_CMDS, command_line, tree_hash
from tests.fixtures.eval_data import make_colors
from tests.fixtures.messages import one_error

REPO = Path(__file__).resolve().parents[1]


# Which bad dataset each command must refuse: text kinds only where the command reads the caption column,
# path-string images only where it reads images.
DATASET_KINDS = {
    "missing": ["deform", "recaption", "filter", "mine-positives", "pretrain", "pseudolabel", "zeroshot", "retrieve", "probe", "debias",
                "export", "split", "pick-caption", "info"],
    "empty": ["deform", "recaption", "filter", "mine-positives", "pretrain", "pseudolabel", "zeroshot", "retrieve", "probe", "debias",
              "export", "split", "pick-caption"],
    "int_captions": ["deform", "recaption", "filter", "mine-positives", "pretrain", "pseudolabel", "retrieve", "export"],
    "list_captions": ["deform", "recaption", "filter", "mine-positives", "pretrain", "pseudolabel", "retrieve", "export"],
    "bytes_captions": ["deform", "recaption", "filter", "mine-positives", "pretrain", "pseudolabel", "retrieve", "export"],
    "empty_captions": ["deform", "recaption", "mine-positives", "pretrain", "pseudolabel", "retrieve", "export", "pick-caption"],
    "corrupt_images": ["recaption", "mine-positives", "pretrain", "pseudolabel", "zeroshot", "retrieve", "probe", "debias",
                       "export"],
    "path_images": ["recaption", "mine-positives", "pretrain", "pseudolabel", "zeroshot", "retrieve", "probe", "debias", "export"],
}
# The second dataset a command reads: filter --reference, probe --eval-data, pretrain --eval-data.
SECONDARY = {
    "filter": ["missing", "empty", "int_captions", "bytes_captions", "empty_captions"],
    "probe": ["missing", "empty", "path_images", "corrupt_images"],
    "pretrain": ["missing", "empty", "int_captions", "path_images", "corrupt_images"],
}
FILE_OUTPUTS = ("zeroshot", "retrieve", "probe", "debias")  # (debias as the sweep runs it: a report JSON)
WRITERS = ["deform", "recaption", "filter", "mine-positives", "pretrain", "pseudolabel", "zeroshot", "retrieve", "probe", "debias",
           "export", "split", "pick-caption"]


def cases():
    for kind, cmds in DATASET_KINDS.items():
        for cmd in cmds:
            yield pytest.param(cmd, kind, id=f"{cmd}-{kind}")
    for cmd in WRITERS:
        for kind in ("out_is_empty", "out_is_a_device", "out_is_a_user_dir", "out_is_a_user_file"):
            yield pytest.param(cmd, kind, id=f"{cmd}-{kind}")  # (a results JSON replaces only a results JSON)
        for kind in ("out_under_a_file", "out_is_data", "out_is_model", "out_inside_model", "out_is_subspace"):
            if kind in ("out_is_model", "out_inside_model") and cmd not in MODEL_CMDS:
                continue
            if kind == "out_is_subspace" and cmd != "debias":
                continue
            yield pytest.param(cmd, kind, id=f"{cmd}-{kind}")
    for cmd in sorted(MODEL_CMDS - {"recaption"}):
        for kind in ("model_missing", "model_is_data", "model_corrupt", "model_truncated"):
            yield pytest.param(cmd, kind, id=f"{cmd}-{kind}")
    for cmd, kinds in SECONDARY.items():
        for kind in kinds:
            yield pytest.param(cmd, f"second_{kind}", id=f"{cmd}-second_{kind}")
    yield pytest.param("debias", "subspace_corrupt", id="debias-subspace_corrupt")
    yield pytest.param("zeroshot", "subspace_corrupt", id="zeroshot-subspace_corrupt")
    yield pytest.param("pretrain", "resume_corrupt", id="pretrain-resume_corrupt")
    yield pytest.param("pretrain", "resume_not_a_run", id="pretrain-resume_not_a_run")
    for kind in ("missing", "empty", "files_missing", "captions_empty", "wrong_format", "out_is_empty", "out_under_a_file", "out_is_csv", "out_is_photos",
                 "out_contains_csv"):
        yield pytest.param("import", kind, id=f"import-{kind}")
    for kind in ("missing", "empty", "out_is_empty", "out_under_a_file", "out_inside_runs"):
        yield pytest.param("report", kind, id=f"report-{kind}")
    for kind in ("not_a_dataset",):
        yield pytest.param("info", kind, id=f"info-{kind}")


def sweep_argv(cmd: str, kind: str, w: dict) -> tuple[list[str], Path | None]:
    """The command line of one sweep case and the output it must not create (None: it exists already)."""
    fresh = w["OUT"] / f"{cmd}-{kind}"
    fresh_out = fresh.with_suffix(".json") if cmd in ("zeroshot", "retrieve", "probe") or (cmd == "debias") else fresh
    if cmd == "import":
        src, out = str(w["csv"]), fresh
        if kind == "missing":
            src = str(w["IN"] / "no_such.csv")
        elif kind == "empty":
            src = str(w["IN"] / "header_only.csv")
        elif kind in ("files_missing", "captions_empty"):
            src = str(w["IN"] / f"{kind}.csv")
        elif kind == "out_is_empty":
            out = ""
        elif kind == "out_under_a_file":
            out = w["file"] / "x"
        elif kind == "out_is_csv":
            out = w["csv"]
        elif kind == "out_is_photos":
            out = w["photos"]
        elif kind == "out_contains_csv":
            out = w["IN"]
        fmt = ["--format", "parquet"] if kind == "wrong_format" else []  # a CSV read as parquet
        return ["import", src, "--out", out, *fmt, "--overwrite", *COMMON], (fresh if out == fresh else None)
    if cmd == "report":
        src, out = w["runs"], fresh
        if kind == "missing":
            src = w["IN"] / "no_runs"
        elif kind == "empty":
            src = w["IN"] / "empty_runs"
        elif kind == "out_is_empty":
            out = ""
        elif kind == "out_under_a_file":
            out = w["file"] / "x"
        elif kind == "out_inside_runs":
            out = w["runs"] / "base" / "seed0" / "zeroshot"
        return ["report", src, "--out", out, "--metric", "zeroshot:top1", *COMMON], (fresh if out == fresh else None)
    if cmd == "info":
        path = w["missing"] if kind == "missing" else str(w["file"])
        return ["info", path, *COMMON], None
    data, out = w["data"], fresh_out
    if kind in DATASET_KINDS:
        data = w[kind]
    elif kind == "out_under_a_file":
        out = w["file"] / "x"
    elif kind == "out_is_empty":
        out = ""  # what a script passes when its variable is unset: `--out "$OUT"`
    elif kind == "out_is_a_device":
        out = w["IN"] / "a_socket"
    elif kind == "out_is_a_user_dir":
        out = w["IN"] / "user_dir"
    elif kind == "out_is_a_user_file":
        out = w["file"]
    elif kind == "out_is_data":
        out = Path(w["data"])
    elif kind == "out_is_model":
        out = w["blip"] if cmd == "recaption" else w["model"]
    elif kind == "out_inside_model":
        out = w["blip"] / "config.json" if cmd == "recaption" else w["model"] / "model" / "config.json"
    elif kind == "out_is_subspace":
        out = w["sub"]
    if kind.startswith("model_"):
        model = {"model_missing": w["IN"] / "no_model", "model_is_data": w["data"], "model_corrupt": w["IN"] / "corrupt_model",
                 "model_truncated": w["IN"] / "truncated_model"}[kind]
        w = {**w, "model": model}
    if kind == "subspace_corrupt":
        w = {**w, "sub": w["IN"] / "corrupt_sub"}
    if kind.startswith("resume_"):
        run = w["IN"] / ("bad_run" if kind == "resume_corrupt" else "good")
        return ["pretrain", "--resume", run, *COMMON], None
    if kind.startswith("second_"):
        bad = w[kind[len("second_"):]]
        if cmd == "pretrain":
            return [*command_line(cmd, w, data, out), "--eval-data", bad, "--eval-where", "split=test", "--overwrite", *COMMON], fresh_out
        w = {**w, "ref": bad}
    argv = command_line(cmd, w, data, out)
    if cmd == "zeroshot" and kind == "subspace_corrupt":
        argv += ["--debias", w["sub"]]
    if cmd == "pseudolabel" and kind in ("path_images", "corrupt_images"):  # the images it reads are the unaligned data's
        argv[1], argv[3] = data, w["ref"]
    return [*argv, "--overwrite", *COMMON], (fresh_out if out == fresh_out else None)


@pytest.mark.parametrize("cmd", [*WRITERS, "import", "report", "info"])
def test_sweep_controls_succeed(world, cli, request, cmd):
    """Each sweep command line with good inputs works, so a refusal in the sweep is the bad input's doing."""
    w = world
    if cmd == "recaption":
        w = {**world, "gpt2": request.getfixturevalue("captioners")["gpt2"]}
    out = world["OUT"] / f"control-{cmd}"
    if cmd == "import":
        argv = ["import", w["csv"], "--out", out]
    elif cmd == "report":
        argv = ["report", w["runs"], "--out", out, "--metric", "zeroshot:top1", "--no-chart"]
    elif cmd == "info":
        argv = ["info", w["data"]]
    else:
        argv = command_line(cmd, w, w["data"], out.with_suffix(".json") if cmd in ("zeroshot", "retrieve", "probe", "debias") else out)
    before = tree_hash(world["IN"])
    r = cli(*argv, *COMMON)
    assert r.exit_code == 0, (argv, r.stdout[-1000:], r.stderr[-1500:])
    assert tree_hash(world["IN"]) == before


@pytest.mark.parametrize("cmd,kind", list(cases()))
def test_bad_input_sweep(world, cli, request, monkeypatch, cmd, kind):
    # Each case runs in a scratch working directory: `--out ""` means the current directory, which the old
    # code replaced (it emptied the directory the tests ran in); a sentinel file there must survive.
    cwd = world["root"] / "cwd"
    cwd.mkdir(exist_ok=True)
    (cwd / "sentinel").write_text("the user's\n")
    monkeypatch.chdir(cwd)
    w = world
    if cmd == "recaption":  # captioning images with BLIP, or (text kinds) paraphrasing captions with GPT-2
        models = request.getfixturevalue("captioners")
        w = {**world, "gpt2": models["gpt2"]}
        if kind in ("path_images", "corrupt_images", "out_is_model", "out_inside_model"):
            w["blip"] = models["blip"]
    before = tree_hash(world["IN"])
    argv, fresh = sweep_argv(cmd, kind, w)
    t = time.time()
    r = cli(*argv)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code in (1, 2), f"{argv}: exit {r.exit_code}\nstdout: {r.stdout[-1500:]}\nstderr: {r.stderr[-1500:]}"
    assert "Traceback" not in r.stderr + r.stdout and "internal error" not in r.stderr, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert tree_hash(world["IN"]) == before, "an input changed"
    assert (cwd / "sentinel").read_text() == "the user's\n", "the working directory was replaced"
    if fresh is not None:
        assert not fresh.exists(), f"{fresh} was written"
    assert time.time() - t < 30


# ---- 1. data loss: everything a command reads is an input, and --out never replaces it


@pytest.mark.parametrize("cmd", ["zeroshot", "retrieve", "benchmark"])
def test_a_results_out_replaces_only_results_vltool_wrote(world, cli, tmp_path, cmd):
    """--out FILE --overwrite over another model's config.json, a user's notes.json, a dataset's state.json or
    an outcomes path holding a file of the user's: refused, nothing changed; over a results JSON (of any
    evaluation command) with its outcomes: replaced."""
    import shutil

    other = tmp_path / "other_model"
    shutil.copytree(world["model"], other)  # (not an input of the command: only its files are at stake)
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}\n')
    shutil.copytree(world["data"], tmp_path / "other_data")
    user_npz = tmp_path / "mine.examples.npz"
    user_npz.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: not vltool's outcomes
    (tmp_path / "mine.json").write_text("{}")
    ev = ["--model", str(world["model"]), "--cache-dir", str(world["root"] / "cache"), "--bootstrap", "0", "--no-progress"]
    argv = (["benchmark", "--datasets", world["data"], "--tasks", "zeroshot"] if cmd == "benchmark" else [cmd, world["data"]]) + ev
    for target in (other / "model" / "config.json", notes, tmp_path / "other_data" / "state.json", tmp_path / "mine.json"):
        before = tree_hash(tmp_path)
        line = one_error(cli(*argv, "--out", target, "--overwrite"), 2)
        assert "vltool replaces only what it wrote" in line and str(target.name) in line, line
        assert tree_hash(tmp_path) == before, f"{target}: a file changed"
    ours = tmp_path / "ours.json"
    assert cli(*argv, "--out", ours).exit_code == 0
    first = json.loads(ours.read_text())
    assert cli("retrieve" if cmd != "retrieve" else "zeroshot", world["data"], *ev, "--out", ours, "--overwrite").exit_code == 0
    assert json.loads(ours.read_text())["command"] != first["command"]  # one evaluation's results replace another's


@pytest.mark.parametrize("cmd,option", [("filter", "--reference"), ("probe", "--eval-data"), ("pseudolabel", "--aligned"),
                                        ("zeroshot", "--debias")])
def test_out_may_not_replace_a_secondary_input(world, cli, cmd, option):
    """Not only DATA: --reference, --eval-data, --aligned, --debias are inputs too, --overwrite or not."""
    before = tree_hash(world["IN"])
    m, cache = str(world["model"]), ["--cache-dir", str(world["root"] / "cache")]
    argv = {
        "filter": ["filter", world["data"], "--reference", world["ref"], "--out", world["ref"]],
        "probe": ["probe", world["data"], "--model", m, "--eval-data", world["ref"], "--out", Path(world["ref"]) / "x.json", *cache],
        "pseudolabel": ["pseudolabel", world["ref"], "--where", "split=test", "--aligned", world["data"], "--aligned-where",
                        "split=train", "--model", m, "--out", world["data"], *cache],
        "zeroshot": ["zeroshot", world["data"], "--model", m, "--debias", world["sub"], "--out", world["sub"] / "r.json", *cache],
    }[cmd]
    line = one_error(cli(*argv, "--overwrite", "--no-progress"), 2)
    assert "inputs are never modified" in line
    assert tree_hash(world["IN"]) == before


def test_import_never_replaces_the_folder_of_its_images(world, cli, tmp_path):
    """`import train.csv --out photos/ --overwrite` used to delete photos/, files the CSV never listed too.
    A folder of the user's is refused as not vltool's; one vltool wrote (an `export --to csv` output,
    whose CSV lists the images inside it) is refused because the import reads its images."""
    before = tree_hash(world["IN"])
    line = one_error(cli("import", world["csv"], "--out", world["photos"], "--overwrite", "--no-progress"), 2)
    assert "vltool did not write" in line
    assert (world["photos"] / "unlisted.png").is_file() and tree_hash(world["IN"]) == before
    r = cli("export", world["data"], "--to", "csv", "--out", tmp_path / "exported", "--no-progress")
    assert r.exit_code == 0, r.stderr
    (tmp_path / "exported" / "mine.txt").write_text("a file the CSV does not list\n")
    before = tree_hash(tmp_path / "exported")
    import shutil

    shutil.copy(tmp_path / "exported" / "data.csv", tmp_path / "list.csv")  # (absolute paths into exported/)
    line = one_error(cli("import", tmp_path / "list.csv", "--out", tmp_path / "exported", "--overwrite", "--no-progress"), 2)
    assert "holds the images this import reads" in line and tree_hash(tmp_path / "exported") == before
    r = cli("import", world["csv"], "--out", tmp_path / "imported", "--no-progress")
    assert r.exit_code == 0, r.stderr


# ---- 2. no tracebacks


@pytest.mark.parametrize("cmd", ["mine-positives", "pseudolabel", "zeroshot", "probe"])
def test_path_strings_in_the_image_column_point_to_import(world, cli, cmd):
    argv, _ = sweep_argv(cmd, "path_images", world)
    line = one_error(cli(*argv), 2)
    assert "not an image column" in line and "vltool import" in line


@pytest.mark.parametrize("kind,says", [("int_captions", "not a text column"), ("list_captions", "not a text column"),
                                       ("bytes_captions", "holds bytes")])
@pytest.mark.parametrize("cmd", ["retrieve", "mine-positives", "pseudolabel", "export"])
def test_wrong_caption_types_are_named(world, cli, cmd, kind, says):
    argv, _ = sweep_argv(cmd, kind, world)
    assert says in one_error(cli(*argv), 2)


def test_an_oserror_while_writing_is_one_line(world, cli, tmp_path, monkeypatch):
    """Disk full half-way through the write: one line, exit 1, no partial output."""
    import datasets

    def full(self, *a, **k):
        raise OSError(28, "No space left on device", str(tmp_path / "x.arrow"))

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", full)
    line = one_error(cli("deform", world["data"], "--out", tmp_path / "out", "--no-progress"), 1)
    assert "the disk is full (no space left on device)" in line  # (vltool.errors.disk_full_message)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_cache_dir_warns_and_runs(world, cli):
    r = cli("zeroshot", world["data"], "--model", world["model"], "--cache-dir", world["file"] / "cache", "--no-progress", "--json")
    assert r.exit_code == 0, r.stderr
    assert "cannot be written" in r.stderr and "running without caching" in r.stderr and "Traceback" not in r.stderr
    assert json.loads(r.stdout)["metrics"]["top1"]["value"] >= 0


def test_debias_missing_queries_and_corrupt_images(world, cli, tmp_path):
    base = ["debias", "--model", world["model"], "--subspace", world["sub"], "--no-progress", "--cache-dir", world["root"] / "cache"]
    line = one_error(cli(*base, "--eval-data", world["data"], "--queries", tmp_path / "nope.txt", "--out", tmp_path / "r.json"), 2)
    assert "--queries" in line and "no such file" in line
    bad = make_colors(tmp_path / "bad", per_class=2, bad_rows=tuple(range(12)))
    import datasets

    ds = datasets.load_from_disk(bad)
    ds.add_column("gender", ["man", "woman"] * 6).save_to_disk(str(tmp_path / "bad_g"))
    line = one_error(cli(*base, "--eval-data", tmp_path / "bad_g", "--out", tmp_path / "r.json"), 1)
    assert "could be decoded" in line and not (tmp_path / "r.json").exists()


# ---- 3. no silent wrong answers


def test_empty_captions_are_missing_text_counted_and_warned(world, cli, tmp_path):
    """"" and whitespace count as no text in retrieve and mine-positives, as None does."""
    import datasets

    ds = datasets.load_from_disk(world["data"])
    caps = list(ds["caption"])
    caps[0], caps[1], caps[2] = "", "   ", None
    ds.remove_columns(["caption"]).add_column("caption", caps, feature=datasets.Value("string")).save_to_disk(str(tmp_path / "d"))
    m, cache = world["model"], ["--cache-dir", world["root"] / "cache", "--no-progress"]
    n = world["n"]
    r = cli("retrieve", tmp_path / "d", "--model", m, "--text-column", "caption", "--json", *cache)
    assert r.exit_code == 0, r.stderr
    assert f"3 of {n} rows have no text in 'caption'" in r.stderr
    r = cli("mine-positives", tmp_path / "d", "--model", m, "--out", tmp_path / "mined", *cache)
    assert r.exit_code == 0, r.stderr
    assert f"3 of {n} rows have no text in 'caption'" in r.stderr


@pytest.mark.parametrize("cmd", ["retrieve", "mine-positives"])
def test_all_empty_captions_are_an_error(world, cli, cmd):
    argv, _ = sweep_argv(cmd, "empty_captions", world)
    assert "every one is empty, whitespace or missing" in one_error(cli(*argv), 2)


def test_no_metric_on_zero_decodable_images(world, cli, tmp_path):
    bad = make_colors(tmp_path / "bad", per_class=2, bad_rows=tuple(range(12)))
    for cmd in ("zeroshot", "retrieve"):
        r = cli(cmd, bad, "--model", world["model"], "--no-progress", "--cache-dir", world["root"] / "cache", "--json")
        assert "could be decoded" in one_error(r, 1) and r.stdout == ""


def test_debias_one_group_and_a_wrong_zeroshot_label_are_errors(world, cli, tmp_path):
    base = ["debias", "--model", world["model"], "--subspace", world["sub"], "--no-progress", "--cache-dir", world["root"] / "cache",
            "--out", tmp_path / "r.json"]
    line = one_error(cli(*base, "--eval-data", world["data"], "--where", "gender=man"), 2)
    assert "only 'man'" in line and "at least two groups" in line
    line = one_error(cli(*base, "--eval-data", world["data"], "--zeroshot-label", "colour"), 2)
    assert "--zeroshot-label 'colour'" in line
    assert not (tmp_path / "r.json").exists()


def test_export_of_zero_samples_fails_without_an_open_clip_command(cli, tmp_path):
    bad = make_colors(tmp_path / "bad", per_class=2, bad_rows=tuple(range(12)))
    r = cli("export", bad, "--out", tmp_path / "wds", "--no-progress")
    assert "nothing was written" in one_error(r, 1)
    assert "open_clip_train" not in r.stdout and not (tmp_path / "wds").exists()


def test_split_refuses_an_existing_column_unless_asked(world, cli, tmp_path):
    line = one_error(cli("split", world["data"], "--out", tmp_path / "s", "--part-column", "caption", "--no-progress"), 2)
    assert "already has a column 'caption'" in line and "--replace-column" in line
    r = cli("split", world["data"], "--out", tmp_path / "s", "--part-column", "caption", "--replace-column", "--no-progress")
    assert r.exit_code == 0, r.stderr


def test_a_dataset_without_rows_says_so(world, cli, tmp_path):
    line = one_error(cli("deform", world["empty"], "--out", tmp_path / "o"), 2)
    assert line == f"error: dataset {world['empty']!r} has no rows"


@pytest.mark.parametrize("where,says", [
    ("split == train", "single '='"), ("split =train", "no spaces around"), ("split=train ", "no spaces around"), ("split==train", "single '='"),
    ("split=validation", "matches no row"),
])
def test_malformed_or_empty_filters_are_named(world, cli, tmp_path, where, says):
    line = one_error(cli("deform", world["data"], "--out", tmp_path / "o", "--where", where), 2)
    assert says in line
    if says == "matches no row":
        assert "--where split=validation" in line and "'test'" in line and "'train'" in line


def test_huge_images_are_bad_images_not_a_raw_warning(monkeypatch, recwarn):
    """DecompressionBomb policy: an image over PIL's pixel limit is skipped like a corrupt one."""
    import io
    import warnings

    from PIL import Image

    from vltool.io import decode_image

    buf = io.BytesIO()
    Image.new("RGB", (12, 12)).save(buf, format="PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 144 pixels: over the limit, under twice it (a warning in PIL)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        assert decode_image({"bytes": buf.getvalue(), "path": None}) is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    assert decode_image({"bytes": buf.getvalue(), "path": None}).size == (12, 12)
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]


# ---- 4. progress


def test_every_command_has_no_progress():
    import typer.main

    from vltool.cli import app

    group = typer.main.get_command(app)
    lacking = [name for name, c in group.commands.items() if not any("--no-progress" in p.opts for p in c.params)]
    assert lacking == []


def test_recaption_checks_the_texts_it_keeps_before_the_work(world, cli, captioners, tmp_path):
    """Image captioning appends to the existing caption: an int caption was an ArrowTypeError after the
    captioning; now it is named before any work."""
    import datasets

    datasets.load_from_disk(world["int_captions"]).remove_columns(["captions"]).save_to_disk(str(tmp_path / "d"))
    r = cli("recaption", tmp_path / "d", "--out", tmp_path / "o", "--model", captioners["blip"], "--num-captions", "1", "--no-progress")
    assert "the existing text column 'caption'" in one_error(r, 2) and "not a text column" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_real_process_prints_one_line(world):
    """Outside the test runner too (warnings, datasets' bars, rich writing to the real stderr): one line."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for kind in ("files_missing", "captions_empty"):
        argv, _ = sweep_argv("import", kind, world)
        r = subprocess.run([sys.executable, "-m", "vltool", *map(str, argv)], env=env, capture_output=True, text=True)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr


@pytest.mark.parametrize("cmd,bar", [("filter", "filter: training"), ("mine-positives", "mining")])
def test_long_loops_show_a_bar_with_rate_unless_no_progress(world, cli, tmp_path, cmd, bar):
    argv = command_line(cmd, world, world["data"], tmp_path / "o")
    r = cli(*argv)
    assert r.exit_code == 0, r.stderr
    line = next((ln for ln in r.stderr.splitlines() if ln.startswith(bar)), "")
    assert "━" in line and "0:00:00" in line, r.stderr  # (the rate shows once a loop has run long enough to measure)
    r = cli(*argv, "--overwrite", "--no-progress")
    assert r.exit_code == 0 and not any(ln.startswith(bar) for ln in r.stderr.splitlines()), r.stderr


def test_quickstart_leaves_the_tracked_results_alone_unless_published(tmp_path):
    """The quick start's report goes to OUT/results (ignored by git); PUBLISH=1 copies it into results/.
    The recipe runs with a stand-in `vltool` that records each call and writes the report's files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vltool"
    fake.write_text('#!/usr/bin/env bash\necho "$@" >> "$CALLS"\n'
                    'if [ "$1" = report ]; then while [ $# -gt 0 ]; do if [ "$1" = --out ]; then out=$2; fi; shift; done\n'
                    '  mkdir -p "$(dirname "$out")"; for e in json md png; do echo new > "$out.$e"; done; fi\n')
    fake.chmod(0o755)
    for publish in ("0", "1"):
        cwd = tmp_path / f"clone{publish}"
        (cwd / "results").mkdir(parents=True)
        (cwd / "results" / "quickstart.md").write_text("committed\n")
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / f"calls{publish}"),
               "IMAGE_WEIGHTS": "w.pth", "TEXT_TOWER": "minilm", "PUBLISH": publish}
        env.pop("RESULTS", None)
        r = subprocess.run(["bash", str(REPO / "recipes" / "quickstart.sh")], cwd=cwd, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert (cwd / "runs" / "quickstart" / "results" / "quickstart.md").read_text() == "new\n"
        assert (cwd / "results" / "quickstart.md").read_text() == ("new\n" if publish == "1" else "committed\n")
        assert "--out runs/quickstart/results/quickstart" in (tmp_path / f"calls{publish}").read_text()


@pytest.mark.parametrize("argv,says", [
    (["retrieve", "emoji", "--model", "m", "--batch-size", "0"], "Invalid value for '--batch-size'"),
    (["zeroshot", "emoji", "--model", "m", "--bogus"], "No such option: --bogus"),
    (["zeroshot"], "Missing argument"),
    (["no-such-command"], "No such command"),
])
def test_a_bad_command_line_is_one_line_too(cli, argv, says):
    line = one_error(cli(*argv), 2)
    assert says in line and "--help`" in line


def test_recaption_skips_and_counts_bad_images(world, cli, captioners, tmp_path):
    """One corrupt image used to end the whole run ("cannot identify image file <_io.BytesIO ...>"); it is
    a bad image like in every other command: skipped, counted, its row gets no new caption."""
    bad = make_colors(tmp_path / "bad", per_class=1, bad_rows=(1, 4))
    r = cli("recaption", bad, "--out", tmp_path / "o", "--model", captioners["blip"], "--num-captions", "1", "--no-progress")
    assert r.exit_code == 0, r.stderr
    assert "warning: 2 images could not be decoded" in r.stderr
    stats = json.loads((tmp_path / "o" / "vltool.json").read_text())["stats"]
    assert stats["rows_with_new_captions"] == 4 and stats["bad_images_this_run_process_0"] == 2


def test_list_and_string_text_columns_are_told_apart(world, cli, tmp_path):
    """A `captions` column must hold lists of strings where lists are read (pick-caption, recaption's
    existing captions, pretrain --caption-sampling); ints were a misleading "no row is left", a string
    column an ArrowTypeError after recaption's work."""
    import datasets

    ds = datasets.load_from_disk(world["data"])
    n = len(ds)
    ds.remove_columns(["captions"]).add_column("captions", [[i] for i in range(n)], feature=datasets.List(datasets.Value("int64"))) \
        .save_to_disk(str(tmp_path / "ints"))
    ds.remove_columns(["captions"]).add_column("captions", ["one text"] * n, feature=datasets.Value("string")) \
        .save_to_disk(str(tmp_path / "strs"))
    line = one_error(cli("pick-caption", tmp_path / "ints", "--out", tmp_path / "o1", "--no-progress"), 2)
    assert "--from 'captions'" in line and "lists of strings, not lists of int64" in line
    line = one_error(cli("pretrain", tmp_path / "strs", "--out", tmp_path / "o2", "--arch", "vltool-micro", "--steps", "1",
                         "--caption-sampling", "random", "--no-progress"), 2)
    assert "one string per row, not lists of strings" in line
    line = one_error(cli("pretrain", world["data"], "--out", tmp_path / "o3", "--arch", "vltool-micro", "--steps", "1",
                         "--text-column", "captions", "--no-progress"), 2)
    assert "holds lists of texts" in line and "--caption-sampling" in line


def test_import_counts_images_over_the_size_limit(world, cli, tmp_path, monkeypatch):
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50)  # the 8x8 photos (64 pixels) are over it
    line = one_error(cli("import", world["csv"], "--out", tmp_path / "o", "--no-progress"), 1)
    assert "'image over the size limit': 4" in line and "DecompressionBombWarning" not in line
