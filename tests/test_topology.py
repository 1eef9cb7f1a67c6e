"""The process topology (vltool.topology): processes started by `accelerate launch` leave no process group
for interpreter teardown to destroy (a gloo group left to it can abort the process at exit, and the
launcher then kills the processes still writing: the blocked-mining test failed that way in 1 of 4 runs)."""

from __future__ import annotations

import pytest
from _launch import launch

SCRIPT = """
import atexit, sys
import torch.distributed as dist

# registered first, so it runs after vltool's exit hook (atexit runs last-in first-out)
atexit.register(lambda: open(f"{sys.argv[1]}.{RANK}", "w").write(str(dist.is_initialized())))
if sys.argv[2] == "state":
    from vltool.topology import process_state

    RANK = process_state().process_index
else:
    from vltool.pretrain.config import PretrainConfig
    from vltool.pretrain.loop import _accelerator

    RANK = _accelerator(PretrainConfig(arch="vltool-micro")).process_index
assert dist.is_initialized()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["state", "pretrain"])
def test_the_process_group_is_destroyed_before_exit(tmp_path, how):
    """With 2 processes, the group is up while the command runs and down when exit hooks run, both for
    commands that take vltool's process state and for pretrain's Accelerator."""
    script = tmp_path / "exit.py"
    script.write_text(SCRIPT)
    launch([script, tmp_path / "up", how], 2)
    assert [(tmp_path / f"up.{r}").read_text() for r in (0, 1)] == ["False", "False"]
