"""The fixture of the tests that need a process group but not a second rank: a gloo
group of one rank in the test's own process, created and destroyed per test."""

import datetime

import pytest
import torch.distributed as dist

from _launch import free_port


@pytest.fixture
def world1():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=10))
    yield
    dist.destroy_process_group()
