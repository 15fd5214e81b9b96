"""runtime.tf32_matmuls: TF32 only within the block and only for a CUDA device (the flag is global: it must come back)."""

import pytest
import torch

from incontext.runtime import tf32_matmuls


@pytest.mark.parametrize("enabled, device, inside", [(True, "cuda", "high"), (True, "cuda:1", "high"),
                                                     (True, "cpu", "highest"), (False, "cuda", "highest")])
def test_tf32_only_inside_the_block_and_only_on_cuda(enabled, device, inside):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with tf32_matmuls(enabled, device):
            assert torch.get_float32_matmul_precision() == inside
        assert torch.get_float32_matmul_precision() == "highest"
        with pytest.raises(RuntimeError):
            with tf32_matmuls(enabled, device):
                raise RuntimeError("an absorb that fails")
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)
