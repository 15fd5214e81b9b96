"""Device, dtype and autocast, decided in one place and passed down (nanoGPT's four lines, with one-line errors).

    runtime = resolve_runtime("cuda", "bfloat16")     # the CLI's --device / --dtype
    model = model.to(runtime.device, runtime.dtype)
    with runtime.autocast():                           # training: float32 weights, bf16/fp16 matmuls
        loss = model(x).sum()

Inference commands (demo, compare, absorb, generate, run, eval) load the model's weights in `dtype`;
training keeps float32 master weights and runs the forward in `autocast()` when dtype is bfloat16/float16.
Every generator and tensor below the CLI follows the model's device (`generator_for`).
"""

from __future__ import annotations

import contextlib
import platform
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
DEVICE_CHOICES = "cpu, cuda or cuda:N"


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ValueError(f"dtype {name} is not one of {', '.join(DTYPES)}")
        return name
    key = str(name).removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_device(name: str | torch.device) -> torch.device:
    """cpu, cuda or cuda:N, and CUDA only where such a device exists."""
    text = str(name)
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return torch.device("cpu")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"device {text!r} is not {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {text}: no CUDA device is available here (use device cpu)")
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"device {text}: there are only {torch.cuda.device_count()} CUDA devices")
    return torch.device(text)


def _supported(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when a linear layer and a softmax run in `dtype` on `device`, else why not."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return "this GPU has no bfloat16 support"
    try:
        x = torch.ones(2, 4, device=device, dtype=dtype)
        torch.softmax(torch.nn.functional.linear(x, x), -1).sum().item()
    except (RuntimeError, TypeError) as error:
        return str(error).splitlines()[0]
    return None


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    dtype: torch.dtype  # the weights' dtype for inference; the autocast dtype for training (weights stay float32)

    @property
    def amp(self) -> bool:
        """Mixed precision (autocast) applies: a half dtype."""
        return self.dtype in (torch.bfloat16, torch.float16)

    def autocast(self):
        """torch.autocast for half dtypes (training with float32 weights), else nothing."""
        if not self.amp:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def generator(self, seed: int) -> torch.Generator:
        return generator_for(self.device, seed)

    def describe(self) -> str:
        return f"{self.device} {dtype_name(self.dtype)}"


def resolve_runtime(device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32") -> Runtime:
    """The runtime of `--device` / `--dtype`; one-line ValueError for a device that is not there, an unknown
    dtype, or a dtype the device cannot compute in."""
    torch_device, torch_dtype = parse_device(device), parse_dtype(dtype)
    reason = _supported(torch_device, torch_dtype)
    if reason is not None:
        raise ValueError(f"dtype {dtype_name(torch_dtype)} is not supported on {torch_device}: {reason}")
    return Runtime(torch_device, torch_dtype)


def generator_for(device: torch.device | str, seed: int) -> torch.Generator:
    """A seeded generator on `device` (torch.multinomial and friends need one on the tensor's device). Same
    seed, same device: same numbers; CPU and CUDA generators draw different streams."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


@contextlib.contextmanager
def tf32_matmuls(enabled: bool, device: torch.device | str):
    """Within the block, float32 matmuls on a CUDA device use TF32 tensor cores (inputs rounded to a 10-bit mantissa,
    float32 accumulation: torch.set_float32_matmul_precision("high")); nothing changes when not `enabled` or off
    CUDA. The previous precision comes back after the block."""
    if not enabled or torch.device(device).type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def frozen_casts(model: torch.nn.Module, dtype: torch.dtype, enabled: bool = True) -> dict[str, torch.Tensor]:
    """Copies in `dtype` of the model's frozen float32 nn.Linear weights (requires_grad False), by name, for
    `torch.func.functional_call(model, casts, ..., tie_weights=False, strict=False)` under autocast in `dtype`.
    Autocast caches its casts only for weights that require grad, so a frozen weight is cast again at every forward
    (kv-prefix trains a prefix against a frozen model: 135M weights cast per step); the copies are the same rounding
    made once, so the forward and backward are the same bit for bit, at half the weights' memory more. An untied
    copy: an output layer that shares the embedding's weight gets its own copy, the embedding keeps its own. Only
    float32 weights: autocast casts nothing else (a float64 model runs in float64 under it, and keeps doing so). Nothing
    (an empty dict: autocast casts at every step, as without this) when not `enabled` (the benchmarks' peer,
    distill.Speed.cast_once), or on a CUDA device
    whose free memory is under twice the copies' size (a float32 model that only just fits keeps training)."""
    if not enabled:
        return {}
    frozen = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if (isinstance(module, torch.nn.Linear) and isinstance(weight, torch.Tensor) and not weight.requires_grad
                and weight.dtype == torch.float32 and dtype != torch.float32):
            frozen[f"{name}.weight" if name else "weight"] = weight
    needed = sum(w.numel() for w in frozen.values()) * dtype.itemsize
    devices = {w.device for w in frozen.values() if w.device.type == "cuda"}
    if any(free_memory(device) < 2 * needed for device in devices):
        return {}
    return {name: weight.detach().to(dtype) for name, weight in frozen.items()}


def free_memory(device: torch.device) -> int:
    """Free bytes on a CUDA device (torch.cuda.mem_get_info)."""
    return torch.cuda.mem_get_info(device)[0]


def device_of(module: torch.nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


def dtype_of(module: torch.nn.Module) -> torch.dtype:
    for tensor in module.parameters():
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def cpu_model_name() -> str:
    """The CPU's model name (/proc/cpuinfo, else what platform knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine(device: str | torch.device = "cpu") -> dict[str, str]:
    """What a cost was measured on, for result files: the CPU, torch's version and, on a CUDA device, the GPU (costs
    from different machines differ: the same absorb took 41.9 s and 20.9 s of CPU time per thread on two)."""
    out = {"cpu": cpu_model_name(), "torch": torch.__version__}
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(device)
    return out
