"""runtime.tf32_matmuls: TF32 only within the block and only for a CUDA device (the flag is global: it must come back);
runtime.frozen_casts: half-precision copies of the frozen linear weights only."""

import pytest
import torch

from incontext.runtime import frozen_casts, tf32_matmuls


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


def test_frozen_casts_copy_the_frozen_linear_weights_only_and_untie_a_shared_output_layer():
    from torch import nn

    model = nn.Sequential(nn.Embedding(11, 6), nn.Linear(6, 6, bias=True), nn.LayerNorm(6), nn.Linear(6, 11, bias=False))
    model[3].weight = model[0].weight  # tied output layer
    model.requires_grad_(False)
    model[1].weight.requires_grad_(True)  # a trained weight: autocast caches its cast itself
    casts = frozen_casts(model, torch.bfloat16)
    assert set(casts) == {"3.weight"}
    assert casts["3.weight"].dtype == torch.bfloat16 and torch.equal(casts["3.weight"], model[0].weight.to(torch.bfloat16))
    assert model[0].weight.dtype == torch.float32  # the embedding keeps its float32 weight
    assert frozen_casts(model.double(), torch.bfloat16) == {}  # autocast leaves float64 alone: so do the casts
    assert frozen_casts(model.to(torch.bfloat16), torch.bfloat16) == {}  # already that dtype: nothing to cast


def test_frozen_casts_leave_a_cuda_device_without_room_to_autocasts_own_casts(monkeypatch):
    """On a CUDA device with less free memory than twice the copies, no copies (autocast casts at every step, the
    same numbers); with room, the copies. The device is faked: the weights' device is all the check reads."""
    from torch import nn

    from incontext import runtime

    model = nn.Linear(8, 4, bias=False).requires_grad_(False)
    monkeypatch.setattr(nn.Parameter, "device", property(lambda self: torch.device("cuda:0")), raising=False)
    needed = 8 * 4 * 2
    monkeypatch.setattr(runtime, "free_memory", lambda device: 2 * needed - 1)
    assert frozen_casts(model, torch.bfloat16) == {}
    monkeypatch.setattr(runtime, "free_memory", lambda device: 2 * needed)
    assert set(frozen_casts(model, torch.bfloat16)) == {"weight"}


def test_machine_names_the_cpu_and_torch_and_no_gpu_on_a_cpu():
    from incontext.runtime import machine

    facts = machine("cpu")
    assert set(facts) == {"cpu", "torch"} and facts["torch"] == torch.__version__ and facts["cpu"]
