import os
import subprocess
import sys

import pytest
import torch

from incontext.models import Transformer
from incontext.train import train
from incontext.train.distributed import Distributed, rank_slice
from train_helpers import checkpoint_tensors, tiny_args, tiny_config


def test_ranks_take_disjoint_rows_that_cover_the_global_batch():
    rows = [list(range(12))[rank_slice(12, Distributed(rank=r, world_size=3))] for r in range(3)]
    assert [sorted(r) for r in rows] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(ValueError, match="not divisible by the 5 processes"):
        rank_slice(12, Distributed(rank=0, world_size=5))


def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    """torchrun with 2 CPU processes (gloo, DDP), global batch 8, against a single process with batch 8."""
    # no biases: the key bias of softmax attention gets an exactly-zero gradient, so in float32 it receives only
    # rounding noise, which Adam normalises into O(lr) updates whose sign differs between summation orders
    extra = ["schedule.total_steps=6", "run.checkpoint_every=0", "run.eval_every=0", "model.bias=false"]
    train(tiny_config(tmp_path / "single", *extra), progress=False)
    config = tmp_path / "task.yaml"
    config.write_text("task: {name: linear_regression}\n")  # the rest comes from --set
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "incontext.cli", "train", str(config), "--no-progress", *tiny_args(tmp_path / "ddp", *extra)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    single, ddp = checkpoint_tensors(tmp_path / "single", 6), checkpoint_tensors(tmp_path / "ddp", 6)
    weights = [name for name in single if name.startswith("model/")]
    assert weights
    worst = max(float((single[n] - ddp[n]).abs().max()) for n in weights)
    assert worst < 1e-6, worst
    # the runs really trained: the weights moved away from their initialisation by far more than the tolerance
    torch.manual_seed(0)
    init = Transformer(tiny_config(tmp_path / "unused").model_config()).state_dict()
    assert max(float((single[f"model/{k}"] - v).abs().max()) for k, v in init.items() if f"model/{k}" in single) > 1e-3
