"""Agent tests run tiny networks: one torch thread is faster and steadier on a shared machine."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
