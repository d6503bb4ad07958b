"""What every item of the GPU suite shares: the run's `Context` (device, size, time budget) and `Skip`.

Kept apart from `suite.py` so that the suite's modules import one copy of these classes whether the suite runs as
`python -m bench.gpu.suite` (its module is then `__main__`) or is imported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository


# ------------------------------------------------------------------------------------------------------------------
# The run's context
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class Context:
    """What every check and measurement needs: the device, the size of the run and its time budget."""

    device: torch.device
    quick: bool  # tiny shapes and few steps (the CPU dry run)
    out: Path
    budget_s: float  # speed items are skipped once the run has used this much wall time
    compile_backend: str  # torch.compile backend of the compile rows (inductor; eager in the quick CPU run)
    started: float = field(default_factory=time.perf_counter)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        """Wait for the device: CUDA kernels run asynchronously, so a timing without this measures the launch."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def autocast(self, enabled: bool = True):
        """bf16 autocast on this device (the trainer's `--precision bf16`)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def remaining(self) -> float:
        return self.budget_s - self.elapsed()

    def free_memory(self) -> None:
        """Between items on a GPU: collect what an item left in reference cycles and return cached blocks, so the
        next item's batch sizes and memory figures do not depend on the previous one (on CPU: nothing to do)."""
        if self.cuda:
            import gc

            gc.collect()
            torch.cuda.empty_cache()


class Skip(Exception):
    """Raised by a check or measurement that cannot run here; its message is the reason, recorded as such."""
