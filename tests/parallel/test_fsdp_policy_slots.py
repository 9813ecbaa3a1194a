"""Note [FSDP2 policy slots] on the installed torch, in one process (a one-rank gloo
group): every slot it finds takes the policy and FSDP2 gathers in its dtype; a slot
it misses is caught at the first forward, naming the torch and the route that works."""

import re

import pytest
import torch
from torch import nn

from core_ops.torch_patches import fsdp_policy_slots as slots

fsdp = pytest.importorskip("torch.distributed.fsdp")


def sharded():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    fsdp.fully_shard(model[0])
    fsdp.fully_shard(model)
    return model


BF16 = fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16)


def test_every_slot_takes_the_policy_and_fsdp2_gathers_in_its_dtype(world1):
    model = sharded()
    for unit in (model, model[0]):
        state = slots.state_of(unit)
        found = slots.slots(state)
        assert found[0] == (state, "_mp_policy") and len(found) >= 2  # the unit's and its params'
        slots.write(state, BF16)
        assert all(getattr(owner, name) is BF16 for owner, name in found)
    seen = []  # after FSDP2's pre-forward hook: the gathered weight
    model[0].register_forward_pre_hook(lambda m, args: seen.append((m.weight.dtype, args[0].dtype)))
    model(torch.randn(3, 4))
    assert seen == [(torch.bfloat16, torch.bfloat16)]
    for unit in (model, model[0]):
        slots.verify(unit, BF16)  # the params' gathered dtype is the policy's


def test_a_slot_missed_is_an_error_at_the_first_forward(world1, monkeypatch):
    """As on a torch that keeps the policy somewhere new: amp.initialize's writes do
    not reach FSDP2, which gathers in float32; the first forward raises instead of
    training the O2 model in float32."""
    from core_ops import amp
    monkeypatch.setattr(slots, "write", lambda state, policy: None)
    model = amp.initialize(sharded(), opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    said = (rf"this torch \({re.escape(torch.__version__)}\) did not take .* gather in torch.float32, not "
            r"torch.bfloat16\. Shard the model with fully_shard\(\.\.\., mp_policy=core_ops\.amp\.fsdp_policy")
    with pytest.raises(slots.LayoutError, match=said):
        model(torch.randn(3, 4))


def test_a_layout_without_the_known_fields_names_what_is_missing(world1):
    model = sharded()
    state = slots.state_of(model[0])
    for name in ("_fsdp_param_groups", "_fsdp_param_group"):
        if name in vars(state):
            delattr(state, name)
    if hasattr(state, "_fsdp_param_groups") or hasattr(state, "_fsdp_param_group"):
        pytest.fail("the groups are not instance attributes on this torch: update this test")
    with pytest.raises(slots.LayoutError, match=r"FSDPState\._fsdp_param_groups not found\): shard the model "
                                                r"with fully_shard\(\.\.\., mp_policy="):
        slots.param_groups(state)
