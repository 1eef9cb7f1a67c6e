"""WebDataset shards given directly to the commands that read a dataset (issue 22; docs/conventions.md,
"Shards as input to every command").

A shard pattern or a folder of shards is read through its index (vltool.io.shard_index): a small dataset
built once in the vltool cache, one row per sample, whose images are `tar://MEMBER::SHARD` paths read by
offset (vltool.shards.read_member). Checked here: the index equals `vltool import` of the same shards
(rows, texts, image bytes) and was built from the headers and small members (not the images); decoding a
tar path equals decoding the member's bytes, at one pread per image and one header scan per shard; the
index is built once and a second builder waits; a damaged shard gives its readable samples and one
warning; retrieve and mine-positives on the shards equal the same commands on the imported shards, exactly;
outputs keep the tar paths and pretrain trains on them; zeroshot names the missing label column; --out
may not lie among the shards. Everything runs on CPU with vltool-micro on shards in img2dataset's layout.
"""

from __future__ import annotations

import io
import json
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.eval_data import make_model
from tests.fixtures.wds import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    """3 shards of 8 samples (24 in all), with img2dataset's statistics files."""
    return make_shards(tmp_path_factory.mktemp("wds") / "shards", shards=3, per_shard=8)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(make_model(tmp_path_factory.mktemp("model") / "run"))


@pytest.fixture(scope="module")
def imported(shards, tmp_path_factory) -> str:
    """The same shards copied into a dataset by `vltool import` (the reference)."""
    from vltool.importer import ImportConfig, import_data

    out = tmp_path_factory.mktemp("imported") / "data"
    import_data(shards, out, ImportConfig())
    return str(out)


def index_dirs(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "shards").iterdir() if not p.name.startswith("."))


def members(shard) -> dict[str, bytes]:
    with tarfile.open(shard) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


# ---------------------------------------------------------------------------------------------------
# The index
# ---------------------------------------------------------------------------------------------------


def test_the_index_holds_the_imported_rows_with_the_images_left_in_the_shards(shards, imported, tmp_path):
    import datasets

    from vltool.io import image_bytes, load_dataset

    cache = Path(tmp_path / "cache")
    loaded = load_dataset(shards, cache_dir=cache)
    ref = datasets.load_from_disk(imported).cast_column("image", datasets.Image(decode=False))
    ds = loaded.dataset.cast_column("image", datasets.Image(decode=False))
    assert isinstance(loaded.dataset.features["image"], datasets.Image)  # a genuine image column
    assert ds["id"] == ref["id"] and ds["caption"] == ref["caption"] and len(ds) == 24
    assert ds["url"] == [f"http://x/{k}.jpg" for k in range(24)] and ds["status"] == ["success"] * 24  # the json's scalars
    first = ds[0]["image"]
    assert first["bytes"] is None and first["path"] == f"tar://000000000.jpg::{Path(shards).parent.resolve() / '00000.tar'}"
    assert [image_bytes(v) for v in ds["image"]] == [v["bytes"] for v in ref["image"]]
    # where it lives, what it says about itself, and what it protects
    (index,) = index_dirs(cache)
    assert loaded.index.path == index and index.name.startswith("shards-") and (index / "state.json").is_file()
    assert loaded.path == Path(shards).parent.resolve()  # the shards are the input (--out may not touch them)
    prov = json.loads((index / "vltool.json").read_text())
    assert prov["command"] == "shard-index" and prov["stats"]["rows_out"] == 24 and prov["stats"]["shards"] == 3
    assert sum(f.stat().st_size for f in index.rglob("*") if f.is_file()) < prov["stats"]["shard_bytes"] / 2
    # a folder of shards is the same shards, hence the same index
    assert load_dataset(str(Path(shards).parent), cache_dir=cache).index.path == index


def test_the_index_reads_headers_and_captions_not_images(tmp_path):
    """Samples whose image is 64 KB: the index reads a small part of the shards (it seeks past the images)."""
    from vltool.io import load_dataset

    root = tmp_path / "big"
    root.mkdir()
    with tarfile.open(root / "00000.tar", "w") as tar:
        for k in range(6):
            for ext, data in (("jpg", np.random.default_rng(k).bytes(64 * 1024)), ("txt", f"caption {k}".encode()),
                              ("json", json.dumps({"key": f"{k:03d}", "width": 8, "height": 8.5}).encode())):
                info = tarfile.TarInfo(f"{k:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    loaded = load_dataset(str(root / "00000.tar"), cache_dir=tmp_path / "cache")
    stats = json.loads((loaded.index.path / "vltool.json").read_text())["stats"]
    assert 18 * 512 <= stats["bytes_read"] < stats["shard_bytes"] / 5, stats  # every header and caption, few image bytes
    assert loaded.dataset["caption"] == [f"caption {k}" for k in range(6)]
    assert loaded.dataset.features["width"].dtype == "int64" and loaded.dataset["height"] == [8.5] * 6


def test_decoding_a_tar_path_equals_decoding_the_member_with_one_read_per_image(shards):
    from PIL import Image

    from vltool import shards as S
    from vltool.io import decode_image, image_bytes
    from vltool.shards import tar_url

    files = sorted(Path(shards).parent.glob("*.tar"))[:2]
    S._forget_open_shards()  # (shards other tests opened)
    before = dict(S.READS)
    for f in files:
        for name, data in members(f).items():
            if name.endswith(".jpg"):
                got = decode_image({"bytes": None, "path": tar_url(name, f)})
                want = Image.open(io.BytesIO(data)).convert("RGB")
                assert np.array_equal(np.asarray(got), np.asarray(want))
    assert S.READS["reads"] - before["reads"] == 16  # one pread per image
    assert S.READS["scans"] - before["scans"] == 2  # one header scan per shard
    # another process (here: this one, its open shards forgotten) reads the member tables the scans wrote
    S._forget_open_shards()
    scans, loads = S.READS["scans"], S.READS["loads"]
    for f in files:
        assert image_bytes({"bytes": None, "path": tar_url("000000001.jpg" if f.name == "00000.tar" else "000010001.jpg", f)}) \
            == members(f)["000000001.jpg" if f.name == "00000.tar" else "000010001.jpg"]
    assert S.READS["scans"] == scans and S.READS["loads"] == loads + 2
    # what cannot be read is a bad image, as an undecodable one
    assert decode_image({"bytes": None, "path": tar_url("nope.jpg", files[0])}) is None
    assert decode_image({"bytes": None, "path": tar_url("000000000.txt", files[0])}) is None
    assert decode_image({"bytes": None, "path": tar_url("000000000.jpg", files[0].with_name("gone.tar"))}) is None


def test_the_index_is_built_once_and_a_second_builder_waits(shards, tmp_path, monkeypatch, capfd):
    from vltool import io as vio
    from vltool.io import index as vindex  # (the module whose shard_index calls _build_shard_index)
    from vltool.io.locks import _acquire
    from vltool.shards import load_shards

    built = []
    real = vindex._build_shard_index
    monkeypatch.setattr(vindex, "_build_shard_index", lambda *a: (built.append(a), real(*a)))
    cache = tmp_path / "cache"
    # another builder holds the index's lock: this one waits, then reads what the other wrote
    first = vio.load_dataset(shards, cache_dir=cache)
    dest = first.index.path
    import shutil

    shutil.rmtree(dest)
    lock = _acquire(dest)
    done = []
    t = threading.Thread(target=lambda: done.append(vio.load_dataset(shards, cache_dir=cache)))
    t.start()
    t.join(1.5)
    assert t.is_alive() and not done  # waiting for the lock
    source = load_shards(shards)
    real(source, dest, dest.name.rsplit("-", 1)[1], shards)  # the other builder finishes
    lock.release()
    t.join(30)
    assert done and done[0].index.path == dest and len(built) == 1  # the waiting one did not build again
    assert index_dirs(cache) == [dest]
    stamp = (dest / "state.json").stat().st_mtime_ns
    vio.load_dataset(shards, cache_dir=cache)
    assert len(built) == 1 and (dest / "state.json").stat().st_mtime_ns == stamp
    assert capfd.readouterr().err.count("indexed into") == 2  # the first build and the other builder's


def test_a_damaged_shard_gives_its_readable_samples_and_a_warning(tmp_path, capfd):
    from vltool.io import decode_image, load_dataset

    pattern = make_shards(tmp_path / "cut", shards=2, per_shard=8, bad=(2,), empty=(3,))
    cut = tmp_path / "cut" / "00001.tar"
    whole = cut.read_bytes()
    cut.write_bytes(whole[: len(whole) // 2 + 100])  # a failed copy: cut inside a member
    loaded = load_dataset(pattern, cache_dir=tmp_path / "cache")
    ids = loaded.dataset["id"]
    stats = json.loads((loaded.index.path / "vltool.json").read_text())["stats"]
    (damaged,) = stats["damaged_shards"]
    assert damaged["shard"].endswith("00001.tar") and 0 < damaged["samples_indexed"] < 8
    assert ids[:7] == [f"00000{j:04d}" for j in range(8) if j != 3]  # sample 3 has no text: skipped and counted
    assert len(ids) == 7 + damaged["samples_indexed"] and stats["skipped"] == {"empty caption": 1}
    err = capfd.readouterr().err
    assert err.count("00001.tar: unreadable after sample") == 1 and "the rest of this shard is skipped" in err
    images = loaded.dataset.cast_column("image", __import__("datasets").Image(decode=False))["image"]
    decoded = [decode_image(v) for v in images]
    assert [d is None for d in decoded] == [k == 2 for k in range(len(ids))]  # sample 2's bytes are no image


def test_repeated_ids_keep_their_first_row_as_import_does(tmp_path):
    import shutil

    import datasets

    from vltool.importer import ImportConfig, import_data
    from vltool.io import load_dataset

    make_shards(tmp_path / "dup", shards=2, per_shard=4)
    shutil.copy(tmp_path / "dup" / "00000.tar", tmp_path / "dup" / "00002.tar")  # the first shard's samples again
    loaded = load_dataset(str(tmp_path / "dup"), cache_dir=tmp_path / "cache")
    import_data(str(tmp_path / "dup"), tmp_path / "imported", ImportConfig())
    assert loaded.dataset["id"] == datasets.load_from_disk(str(tmp_path / "imported"))["id"] == [f"0000{s}000{j}" for s in (0, 1) for j in range(4)]
    assert json.loads((loaded.index.path / "vltool.json").read_text())["stats"]["skipped"] == {"duplicate id": 4}


def test_compressed_shards_are_refused(tmp_path):
    from vltool.errors import UsageError
    from vltool.io import load_dataset

    (tmp_path / "s").mkdir()
    with tarfile.open(tmp_path / "s" / "00000.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("a.txt")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(UsageError, match="compressed shards"):
        load_dataset(str(tmp_path / "s" / "00000.tar.gz"))


# ---------------------------------------------------------------------------------------------------
# Commands on shards
# ---------------------------------------------------------------------------------------------------


def test_retrieve_on_shards_equals_retrieve_on_the_import(cli, shards, imported, model, tmp_path):
    args = ["--model", model, "--bootstrap", "20", "--json", "--no-progress", "--cache-dir", tmp_path / "cache"]
    a = cli("retrieve", shards, *args)
    b = cli("retrieve", imported, *args)
    assert a.exit_code == 0 and b.exit_code == 0, a.stderr + b.stderr
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert ra["metrics"] == rb["metrics"] and ra["chance"] == rb["chance"] and ra["data"]["images"] == 24
    assert ra["inputs"][0]["format"] == "wds" and ra["inputs"][0]["shards"] == 3
    # the index built on the way does not take the command's start-up mark
    assert 0 < ra["seconds_to_first_batch"] <= ra["wall_time_s"]
    # the second command reuses the index (and the embeddings cached under its fingerprint)
    c = cli("retrieve", str(Path(shards).parent), *args)
    assert c.exit_code == 0 and "indexed into" not in c.stderr and "indexed into" in a.stderr
    assert json.loads(c.stdout)["stats"]["cache"]["images"]["hit"] is True
    assert len(index_dirs(tmp_path / "cache")) == 1


def test_mine_positives_on_shards_equals_the_import_and_pretrain_trains_on_its_output(cli, shards, imported, model, tmp_path):
    import datasets

    from tests.fixtures.training import micro
    from vltool.pretrain import pretrain

    args = ["--model", model, "--p-it", "-1", "--p-ii", "0.999", "--p-tt", "0.999", "--p-it-tt", "0.999",
            "--max-positives", "3", "--cache-dir", tmp_path / "cache", "--no-progress"]
    a = cli("mine-positives", shards, "--out", tmp_path / "from_shards", *args)
    b = cli("mine-positives", imported, "--out", tmp_path / "from_import", *args)
    assert a.exit_code == 0 and b.exit_code == 0, a.stderr + b.stderr
    da, db = datasets.load_from_disk(str(tmp_path / "from_shards")), datasets.load_from_disk(str(tmp_path / "from_import"))
    assert da["id"] == db["id"] and da["positives"] == db["positives"] and da["positive_scores"] == db["positive_scores"]
    assert all(len(p) == 3 for p in da["positives"])
    # the output points into the shards: small, with the tar paths kept
    paths = da.cast_column("image", datasets.Image(decode=False))["image"]
    assert all(v["bytes"] is None and v["path"].startswith("tar://") for v in paths)
    size = sum(f.stat().st_size for f in (tmp_path / "from_shards").rglob("*") if f.is_file())
    assert size < sum(f.stat().st_size for f in (tmp_path / "from_import").rglob("*") if f.is_file()) / 2
    # pretrain reads the images from the shards, with the mined positives
    r = pretrain([str(tmp_path / "from_shards")], tmp_path / "run", micro(steps=2, loss="sigmoid", mined_positives=True),
                 progress=False)
    assert r["stats"]["steps"] == 2 and r["stats"]["bad_images"] == 0 and np.isfinite(r["stats"]["final_loss"])


def test_other_commands_take_shards(cli, shards, model, tmp_path):
    """info describes the index; export copies the images out of the shards; deform keeps the tar paths;
    zeroshot names the missing label column; benchmark runs what their columns allow (retrieval); an
    --out among the shards is refused."""
    cache = ["--cache-dir", tmp_path / "cache"]
    r = cli("info", shards, "--json")
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["shards"]["shards"] == 3 and rec["provenance"]["made_by"] == "shard-index"
    r = cli("export", shards, "--to", "webdataset", "--out", tmp_path / "exported", "--no-progress")
    assert r.exit_code == 0, r.stderr
    ref = members(Path(shards).parent / "00000.tar")
    got = members(tmp_path / "exported" / "00000.tar")
    assert got["000000001.jpg"] == ref["000000001.jpg"]
    r = cli("deform", shards, "--out", tmp_path / "deformed", "--no-progress")
    assert r.exit_code == 0, r.stderr
    import datasets

    images = datasets.load_from_disk(str(tmp_path / "deformed")).cast_column("image", datasets.Image(decode=False))["image"]
    assert all(v["path"].startswith("tar://") for v in images)
    # its images live in the shards: they are inputs of every command that reads it, never its --out
    shard_dir, first = Path(shards).parent, sorted(Path(shards).parent.glob("*.tar"))[0]
    before = first.read_bytes()
    r = cli("split", tmp_path / "deformed", "--parts", "a=0.5,b=0.5", "--out", shard_dir / "split", "--no-progress")
    assert r.exit_code == 2 and "would overwrite the input" in r.stderr and not (shard_dir / "split").exists(), r.stderr
    r = cli("retrieve", tmp_path / "deformed", "--model", model, "--out", first, "--overwrite", "--no-progress", *cache)
    assert r.exit_code == 2 and "would overwrite the input" in r.stderr and first.read_bytes() == before, r.stderr
    r = cli("zeroshot", shards, "--model", model, "--no-progress", *cache)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.exit_code == 2 and len(errors) == 1 and "no 'label' or 'labels' column" in errors[0], r.stderr
    r = cli("benchmark", "--datasets", shards, "--model", model, "--bootstrap", "10", "--json", "--no-progress", *cache)
    assert r.exit_code == 0, r.stderr
    assert {row["task"] for row in json.loads(r.stdout)["table"]} == {"retrieve"}  # no labels: retrieval only
    inside = Path(shards).parent / "mined"
    r = cli("mine-positives", shards, "--model", model, "--out", inside, "--no-progress", *cache)
    assert r.exit_code == 2 and "would overwrite the input" in r.stderr and not inside.exists()


def test_pretrain_streams_a_folder_of_shards_unless_told_hf(shards):
    from tests.fixtures.training import micro
    from vltool.pretrain.setup import _is_shards

    folder = str(Path(shards).parent)
    assert _is_shards([folder], micro()) and _is_shards([shards], micro())
    assert not _is_shards([folder], micro(data_format="hf"))


@pytest.mark.slow
def test_two_processes_build_the_index_once_and_retrieve_as_one(shards, model, tmp_path):
    """`accelerate launch` with 2 CPU processes on shards no index exists for: the main process builds it,
    the other waits at the barrier, and the metrics equal one process's."""
    from tests.fixtures.launch import launch

    args = ["-m", "vltool", "retrieve", shards, "--model", model, "--bootstrap", "20", "--json", "--no-progress"]
    one = launch([*args, "--cache-dir", tmp_path / "one"], 1, in_process=False)
    two = launch([*args, "--cache-dir", tmp_path / "two"], 2)
    assert two.stderr.count("indexed into") == 1 and len(index_dirs(tmp_path / "two")) == 1
    assert json.loads(two.stdout)["metrics"] == json.loads(one.stdout)["metrics"]


def test_a_cache_that_cannot_be_written_gets_an_index_for_this_run(shards, model, tmp_path, capsys):
    """A cache directory that cannot be created (a file in its way): the index is built in a temporary
    directory for this run, with one warning, the metrics are those of a run with a cache, and nothing is
    left in the temporary directory afterwards (the process that built it removes it at exit)."""
    from tests.fixtures.launch import launch

    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    args = ["-m", "vltool", "retrieve", shards, "--model", model, "--bootstrap", "20", "--json", "--no-progress"]
    ref = launch([*args, "--cache-dir", tmp_path / "cache"], 1, in_process=False)
    r = launch([*args, "--cache-dir", blocked / "cache"], 1, in_process=False)
    assert r.stderr.count("it is built for this run only") == 1
    assert json.loads(r.stdout)["metrics"] == json.loads(ref.stdout)["metrics"]
    assert blocked.read_text() == "not a directory"


@pytest.mark.slow
def test_two_processes_share_the_index_built_for_the_run_when_the_cache_cannot_be_written(shards, model, tmp_path):
    """The same under `accelerate launch` with 2 processes: the first builds the run's index in a temporary
    directory that the other finds by name (it reads no cache), and the metrics equal one process's."""
    import tempfile

    from tests.fixtures.launch import launch

    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    args = ["-m", "vltool", "retrieve", shards, "--model", model, "--bootstrap", "20", "--json", "--no-progress"]
    before = set(Path(tempfile.gettempdir()).glob("vltool-shard-index-*"))
    one = launch([*args, "--cache-dir", tmp_path / "cache"], 1, in_process=False)
    two = launch([*args, "--cache-dir", blocked / "cache"], 2)
    assert two.stderr.count("it is built for this run only") == 1
    assert json.loads(two.stdout)["metrics"] == json.loads(one.stdout)["metrics"]
    assert set(Path(tempfile.gettempdir()).glob("vltool-shard-index-*")) == before  # removed at exit

