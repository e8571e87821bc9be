"""Where and in what precision a checkpoint is evaluated: ``resolve_device("auto", "auto")``.

    placement = resolve_device("auto", "auto")   # Placement(device="cuda:0", dtype="bfloat16", reason=...)
    placement = resolve_device("cpu", "auto")    # Placement(device="cpu", dtype="float32", ...)

``auto`` device: the first CUDA device when ``torch.cuda.is_available()``, else the CPU. ``auto``
dtype: bfloat16 on CUDA (every GPU lm-eval and vLLM target here has it), float32 on the CPU (CPU
bf16 matmuls are slow and greedy answers drift from the fp32 reference); an explicit dtype is
taken as given. Asking for CUDA where there is none is an error naming the setting and the fix
rather than a silent fallback: an eval report must say what it measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICE_HELP = '"auto", "cpu", "cuda" or "cuda:N"'


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" or "cuda:N"
    dtype: str  # a torch dtype name: float32 | bfloat16 | float16
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"device": self.device, "dtype": self.dtype, "reason": self.reason}


def resolve_device(device: str = "auto", dtype: str = "auto") -> Placement:
    """The concrete device and dtype for ``device`` / ``dtype`` settings (see the module docstring)."""
    import torch  # torch: import-time stays torch-free

    device = (device or "auto").strip().lower()
    if device != "auto" and device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", device):
        raise ValueError(f"eval device {device!r} is not one of {DEVICE_HELP}")
    if dtype not in DTYPES:
        raise ValueError(f"eval dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    cuda = torch.cuda.is_available()
    if device == "auto":
        device, why = ("cuda:0", "auto: CUDA is available") if cuda else ("cpu", "auto: no CUDA device")
    elif device.startswith("cuda"):
        if not cuda:
            raise ValueError(f"eval device {device!r}: torch sees no CUDA device here; use device='cpu' or 'auto'")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"eval device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
        device, why = f"cuda:{index}", "asked for"
    else:
        why = "asked for"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return Placement(device, dtype, f"{why}; dtype {dtype}")
