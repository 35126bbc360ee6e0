"""The tripwire itself must trip, or every I1 test would pass vacuously."""

import pytest
import torch

from tests.conftest import CudaTripped


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.cuda.synchronize(),
        lambda: torch.cuda.is_available(),
        lambda: torch.cuda.current_stream(),
        lambda: torch.cuda.Event(),
        lambda: torch.cuda.mem_get_info(),
        lambda: torch.zeros(2).cuda(),
        lambda: torch.zeros(2).pin_memory(),
        lambda: torch.zeros(2).to("cuda"),
        lambda: torch.zeros(2).to(torch.device("cuda", 0)),
        lambda: torch.empty(2, pin_memory=True),
        lambda: torch.zeros(2, device="cuda"),
    ],
)
def test_tripwire_trips(call):
    with pytest.raises(CudaTripped):
        call()


def test_cpu_work_passes_tripwire():
    x = torch.zeros(3).to("cpu").to(torch.float64)
    assert x.sum().item() == 0.0
    torch.manual_seed(0)  # seeding is lazy for CUDA and must stay allowed
