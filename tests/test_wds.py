"""`vltool pretrain` on WebDataset shards, streamed (issue 22; docs/pretrain.md, "Streaming shards").

The stream (vltool.pretrain.data.ShardStream): every sample once per epoch, seeded shard order and shuffle
buffer, disjoint streams per process and worker, resumable at any sample. Training: exact resume (bitwise in
one process, across an epoch boundary, with and without data-loader workers), bad samples skipped and
counted, and 2 processes equal to 1 process whose 2 workers are the same 2 streams (`-m slow`), with exact
resume in 2 processes. Everything runs on CPU with vltool-micro on shards written in img2dataset's layout.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.launch import launch
from tests.fixtures.messages import error_line
from tests.fixtures.training import PRETRAIN, make_pairs, metrics, micro, weights
from tests.fixtures.wds import make_shards
from vltool.errors import UsageError


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    """4 shards of 12 samples (48 in all), with img2dataset's statistics files."""
    return make_shards(tmp_path_factory.mktemp("wds") / "shards", shards=4, per_shard=12)


def stream(pattern, world=1, rank=0, sizes=(4,), seed=0, buffer=5, starts=None):
    from vltool.pretrain.data import ShardStream
    from vltool.shards import expand_shards

    def make_item(epoch, row, id_, text, image):
        return {"epoch": epoch, "row": row, "id": id_, "text": text}

    return ShardStream(expand_shards(pattern), make_item, "caption", world, rank, sizes, seed, buffer, starts)


def take(s, worker, n):
    """The first n (epoch, id) of a stream's samples."""
    return [(e, raw[2]) for (e, _, raw), _ in zip(s.samples(s.stream_of(worker), *s.starts.get(worker, (0, 0))), range(n))]


def test_shard_patterns_and_counts(shards, tmp_path):
    from vltool.shards import expand_shards, is_shard_spec, load_shards

    root = Path(shards).parent
    assert [p.name for p in expand_shards(shards)] == [f"{i:05d}.tar" for i in range(4)]
    assert expand_shards(str(root)) == expand_shards(str(root / "*.tar")) == expand_shards(shards)
    assert is_shard_spec(shards) and not is_shard_spec(str(root))
    src = load_shards(shards)
    assert src.rows == 48 and src.path == root.resolve() and len(src.fingerprint) == 32
    with pytest.raises(UsageError, match="does not exist"):
        expand_shards(str(root / "{00000..00009}.tar"))
    nostats = make_shards(tmp_path / "nostats", shards=2, per_shard=3, stats=False)
    assert load_shards(nostats).rows is None


def test_stream_epochs_cover_every_sample_once_in_a_seeded_order(shards):
    s = stream(shards)
    first = take(s, 0, 96)
    ids = sorted({i for _, i in first})
    assert len(ids) == 48
    e0, e1 = [i for e, i in first if e == 0], [i for e, i in first if e == 1]
    assert sorted(e0) == sorted(e1) == ids  # each epoch is every sample once
    assert e0 != e1  # reshuffled per epoch
    assert take(stream(shards), 0, 96) == first  # the seed fixes the order
    assert take(stream(shards, seed=1), 0, 48) != first[:48]
    unshuffled = [raw[2] for raw in s.raw_samples(0, 0)]
    assert [i for _, i in first[:48]] != unshuffled  # the buffer shuffles within the shards, not only their order


def test_streams_split_the_shards(shards):
    """2 processes x 2 workers: 4 streams reading disjoint shards whose union is every sample."""
    seen = []
    for rank in range(2):
        s = stream(shards, world=2, rank=rank, sizes=(2, 2))
        for w in range(2):
            got = take(s, w, 12)
            assert {e for e, _ in got} == {0}
            seen.append({i[:5] for _, i in got})  # the shard of each sample
    assert all(len(x) == 1 for x in seen) and len(set.union(*seen)) == 4
    with pytest.raises(UsageError, match="at least as many shards"):
        stream(shards, world=2, sizes=(2, 2, 2))


def test_stream_resumes_at_any_sample(shards):
    s = stream(shards)
    whole = take(s, 0, 80)
    for at in (0, 1, 7, 47, 48, 50):
        e, n = (0, at) if at <= 48 else (1, at - 48)
        assert take(stream(shards, starts={0: (e, n)}), 0, 80 - at) == whole[at:], at


def test_batches_carry_positions(shards):
    s = stream(shards, sizes=(3, 2))
    it = iter(s)  # no data-loader worker: worker 0
    b = [next(it) for _ in range(17)]
    # stream 0 of 2 reads 2 of the 4 shards per epoch (24 samples): 51 samples are 2 epochs and 3 samples
    assert [len(x["items"]) for x in b] == [3] * 17 and b[-1]["position"] == (2, 3)
    assert [x["id"] for x in b[0]["items"]] == [i for _, i in take(s, 0, 3)]


def test_resume_equals_uninterrupted_bitwise(tmp_path, shards):
    """Stop after 3 steps (mid-epoch), resume: the same weights, bit for bit, and the same losses as one run
    of 8 steps (past the first epoch of 6 steps)."""
    from vltool.pretrain import pretrain

    cfg = micro(steps=8, shuffle_buffer=7, caption_sampling=None, augment="simclr")
    full = pretrain([shards], tmp_path / "full", cfg, progress=False)
    assert full["stats"]["data_format"] == "wds" and full["stats"]["epochs"] == pytest.approx(8 / 6, abs=1e-3)
    assert full["stats"]["rows_used"] == 48 and full["inputs"][0]["format"] == "wds"
    r = pretrain([shards], tmp_path / "part", cfg, stop_after_steps=3, progress=False)
    assert r["status"] == "stopped"
    saved = json.loads((tmp_path / "part" / "checkpoints" / "step_00000003" / "data_0.json").read_text())
    assert saved == {"streams": {"0": [0, 24]}}  # 3 steps x 8 samples of the only stream
    pretrain(resume=tmp_path / "part", progress=False)
    a, b = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [m["loss"] for m in metrics(tmp_path / "part")] == [m["loss"] for m in metrics(tmp_path / "full")]


def test_resume_with_workers_equals_uninterrupted(tmp_path, shards):
    """2 data-loader workers (2 streams, each giving whole micro-batches of 8 in turn): stopped after 3 steps
    (the next turn is worker 1's), resume equals the uninterrupted run."""
    from vltool.pretrain import pretrain

    cfg = micro(steps=7, workers=2, shuffle_buffer=3)
    pretrain([shards], tmp_path / "full", cfg, progress=False)
    pretrain([shards], tmp_path / "part", cfg, stop_after_steps=3, progress=False)
    saved = json.loads((tmp_path / "part" / "checkpoints" / "step_00000003" / "data_0.json").read_text())
    assert saved == {"streams": {"0": [0, 16], "1": [0, 8]}}
    pretrain(resume=tmp_path / "part", progress=False)
    a, b = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_samples_are_skipped_and_counted(tmp_path):
    from vltool.pretrain import pretrain

    pattern = make_shards(tmp_path / "bad", shards=2, per_shard=8, bad=(1, 9), empty=(4,))
    r = pretrain([pattern], tmp_path / "run", micro(steps=2, shuffle_buffer=1), progress=False)
    assert r["stats"]["bad_images"] == 3 and sorted(r["stats"]["bad_image_ids"]) == ["000000001", "000000004", "000010001"]
    assert r["stats"]["samples_seen"] == 13  # 16 samples, 3 skipped


def test_a_damaged_shard_is_read_up_to_the_damage_with_a_warning(tmp_path, capfd):
    """A shard cut short mid-member (a failed copy) gives its samples before the cut, one warning naming
    it, and training goes on; before, it stopped the run with an "internal error" (tarfile.ReadError)."""
    from vltool.pretrain import pretrain
    from vltool.shards import iter_samples

    pattern = make_shards(tmp_path / "cut", shards=2, per_shard=8)
    cut = tmp_path / "cut" / "00001.tar"
    whole = cut.read_bytes()
    cut.write_bytes(whole[: len(whole) // 2 + 100])
    with pytest.raises(tarfile.ReadError):
        list(iter_samples(cut))
    r = pretrain([pattern], tmp_path / "run", micro(steps=2, shuffle_buffer=1), progress=False)
    assert r["stats"]["steps"] == 2
    err = capfd.readouterr().err
    assert err.count("00001.tar: unreadable after 3 sample(s)") == 1 and "the rest of this shard is skipped" in err  # the stream's
    assert err.count("its 3 readable samples are indexed") == 1  # the index's, which counted the samples of an epoch


def test_what_streaming_refuses(tmp_path, shards):
    from vltool.pretrain import pretrain

    nostats = make_shards(tmp_path / "nostats", shards=2, per_shard=8, stats=False)
    r = pretrain([nostats], tmp_path / "a", micro(steps=None, epochs=1), progress=False)  # no statistics files: the index counts
    assert r["stats"]["rows_used"] == 16 and r["stats"]["steps"] == 2
    with pytest.raises(UsageError, match="--where and --split"):
        pretrain([shards], tmp_path / "c", micro(), where=["split=train"], progress=False)
    with pytest.raises(UsageError, match="at least as many shards"):
        pretrain([nostats], tmp_path / "d", micro(workers=3), progress=False)
    with pytest.raises(UsageError, match="mixes tar shards and datasets"):
        pretrain([shards, "emoji"], tmp_path / "e", micro(), progress=False)
    with pytest.raises(UsageError, match="--mined-positives"):
        pretrain([shards], tmp_path / "f", micro(loss="sigmoid", mined_positives=True), progress=False)
    assert not any((tmp_path / x).exists() for x in "cdef")


def test_statistics_files_that_overcount_are_checked_against_the_index(tmp_path, capfd):
    """img2dataset's *_stats.json claiming 40 samples a shard where there are 8: an epoch is the 16 samples
    the shards hold (the index's count), with a warning; it ran 10 steps (5 passes) and logged epoch 0.2."""
    from vltool.pretrain import pretrain

    pattern = make_shards(tmp_path / "lying", shards=2, per_shard=8)
    for stats in (tmp_path / "lying").glob("*_stats.json"):
        stats.write_text(json.dumps({"successes": 40}))
    r = pretrain([pattern], tmp_path / "run", micro(steps=None, epochs=1, shuffle_buffer=1), progress=False)
    assert r["stats"]["steps"] == 2 and r["stats"]["rows_used"] == 16  # 16 samples / batch 8
    err = capfd.readouterr().err
    assert "count 80 samples, but the shards hold 16" in err and "an epoch is the 16" in err


def test_eval_data_that_is_the_training_shards_is_refused(cli, tmp_path, shards):
    """--eval-data naming the training shards (or a dataset holding their rows) evaluates on training rows:
    refused as it is for datasets on disk, with the training ids from the shards' index."""
    from vltool.pretrain import pretrain

    with pytest.raises(UsageError, match="48 rows of --eval-data are also training rows"):
        pretrain([shards], tmp_path / "run", micro(steps=1), eval_data=[shards], progress=False)
    r = cli("pretrain", shards, "--eval-data", shards, "--out", tmp_path / "run", "--arch", "vltool-micro", "--steps", "1",
            "--batch-size", "8", "--no-progress")
    assert r.exit_code == 2 and "are also training rows" in r.stderr and not (tmp_path / "run").exists()


def test_an_error_in_a_data_worker_is_one_line(cli, tmp_path):
    """An empty shard read by a DataLoader worker (--workers 2: each stream reads one of the 2 shards): the
    worker's error arrives as one line, its own message (it arrived with the worker's whole traceback folded
    into the line). (Shards that are all empty are refused by their index before training.)"""
    pattern = make_shards(tmp_path / "empty", shards=2, per_shard=4, stats=False)
    tarfile.open(tmp_path / "empty" / "00001.tar", "w").close()
    r = cli("pretrain", pattern, "--out", tmp_path / "run", "--arch", "vltool-micro", "--steps", "3", "--batch-size", "2",
            "--workers", "2", "--no-progress")
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert re.fullmatch(r"error: data stream [01] read no sample from its shards in epoch 0", lines[-1]), r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()


def test_cli_trains_on_a_shard_pattern(cli, tmp_path, shards):
    r = cli("pretrain", shards, "--out", tmp_path / "run", "--arch", "vltool-micro", "--steps", "2", "--batch-size", "8",
            "--shuffle-buffer", "4", "--json", "--no-progress")
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["steps"] == 2 and s["data_format"] == "wds" and np.isfinite(s["final_loss"])
    r = cli("pretrain", str(Path(shards).parent), "--data-format", "wds", "--out", tmp_path / "dir", "--arch", "vltool-micro",
            "--steps", "1", "--batch-size", "8", "--no-progress")
    assert r.exit_code == 0, r.stderr


# ---------------------------------------------------------------------------------------------------
# Two processes (accelerate launch, CPU)
# ---------------------------------------------------------------------------------------------------

LAUNCH_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(1)
    from vltool.pretrain import PretrainConfig, pretrain

    data, out, batch, workers, stop, accum = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    cfg = PretrainConfig(arch="vltool-micro", batch_size=batch, workers=workers, steps=8, optimizer="sgd", lr=0.05,
                         log_every=1, augment="clip", shuffle_buffer=5, accum_steps=accum)
    pretrain([data], out + "/full", cfg, progress=False)
    if stop:
        pretrain([data], out + "/part", cfg, stop_after_steps=stop, progress=False)
        pretrain(resume=out + "/part", progress=False)
    """
)


def _launch(tmp_path, shards, nproc, batch, workers, stop, accum=1) -> Path:
    script = tmp_path / "wds_run.py"
    script.write_text(LAUNCH_SCRIPT)
    out = tmp_path / f"p{nproc}"
    out.mkdir()
    launch([script, shards, out, batch, workers, stop, accum], nproc, timeout=600, in_process=False)
    return out


@pytest.mark.slow
def test_two_processes_equal_one_with_two_streams_and_resume_exactly(tmp_path, shards):
    """2 processes x 2 workers x batch 4 (streams worker x 2 + rank: each turn's two micro-batches are streams
    0 and 1, then 2 and 3) train as 1 process x 4 workers x batch 4 x --accum-steps 2 (streams 0, 1, 2, 3 in
    turn, two a step): the same global batches in the same order. In 2 processes, a run stopped after 3 steps
    (the next turn is worker 1's) and resumed equals the uninterrupted one."""
    one = _launch(tmp_path, shards, 1, batch=4, workers=4, stop=0, accum=2)
    two = _launch(tmp_path, shards, 2, batch=4, workers=2, stop=3)
    np.testing.assert_allclose([m["loss"] for m in metrics(two / "full")], [m["loss"] for m in metrics(one / "full")], rtol=1e-5)
    a, b = weights(one / "full"), weights(two / "full")
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=1e-5, msg=k)
    c = weights(two / "part")
    assert all(torch.equal(b[k], c[k]) for k in b)
    for rank in range(2):  # 3 micro-batches of 4: worker 0 gave two, worker 1 one
        saved = json.loads((two / "part" / "checkpoints" / "step_00000003" / f"data_{rank}.json").read_text())
        assert saved == {"streams": {"0": [0, 8], "1": [0, 4]}}
    stats = json.loads((two / "full" / "vltool.json").read_text())["stats"]
    assert stats["num_processes"] == 2 and stats["global_batch"] == 8


def test_streamed_shards_without_text_are_named_so(cli, tmp_path):
    """A batch of samples without text (the shards have 4 captions in 32 samples) was "not one image of the
    batch could be decoded ... images are corrupt or missing"."""
    pattern = make_shards(tmp_path / "few", shards=1, per_shard=32, empty=range(4, 32))
    r = cli("pretrain", pattern, "--out", tmp_path / "run", "--shuffle-buffer", "1", *PRETRAIN)
    assert r.exit_code == 1
    line = error_line(r)
    assert line.startswith("error: step 2: not one sample of the batch has a text in 'caption' (4 without one"), line
    assert "corrupt" not in line and not (tmp_path / "run").exists()
    nothing = make_shards(tmp_path / "none", shards=1, per_shard=8, empty=range(8), stats=False)
    r = cli("pretrain", nothing, "--out", tmp_path / "run", *PRETRAIN)
    assert r.exit_code == 1 and "no sample of the 1 shards has an image and a text" in error_line(r)


def test_streamed_shards_with_repeated_ids_are_refused_as_a_dataset_is(tmp_path):
    """One rule for ids, whatever the form of the training data: a dataset whose ids repeat is refused, and so
    are shards whose samples repeat a key (they trained silently), streamed or read through their index, and an
    id in two DATA arguments without --prefix-ids."""
    from vltool.pretrain import pretrain

    pattern = make_shards(tmp_path / "shards", shards=2, per_shard=8, stats=False)
    twice = tmp_path / "twice"
    twice.mkdir()
    shutil.copy(tmp_path / "shards" / "00000.tar", twice / "00000.tar")
    shutil.copy(tmp_path / "shards" / "00000.tar", twice / "00001.tar")
    for fmt in ("wds", "hf"):
        with pytest.raises(UsageError, match=r"'.*twice' has duplicate ids \(8 samples repeat .*\); ids must be unique"):
            pretrain([str(twice)], tmp_path / "run", micro(steps=1, batch_size=4, data_format=fmt), progress=False)
    with pytest.raises(UsageError, match="has duplicate ids"):
        pretrain([make_pairs(tmp_path / "pairs", n=8, ids=["same"] * 8)], tmp_path / "run", micro(steps=1, batch_size=4),
                 progress=False)
    with pytest.raises(UsageError, match="pass --prefix-ids"):
        pretrain([pattern, str(tmp_path / "shards" / "00001.tar")], tmp_path / "run", micro(steps=1, batch_size=4), progress=False)
    assert not (tmp_path / "run").exists()
    r = pretrain([pattern, str(tmp_path / "shards" / "00001.tar")], tmp_path / "run", micro(steps=1, batch_size=4, prefix_ids=True),
                 progress=False)
    assert r["stats"]["steps"] == 1
    assert json.loads((tmp_path / "run" / "vltool.json").read_text())["command"] == "pretrain"
