import pytest
import torch

from drmas.algorithms import invalid_action_penalty, mix_rewards


def test_mix_rewards_floats_and_tensors():
    assert mix_rewards(1.0, 0.5, alpha=2.0) == 2.5
    assert mix_rewards(1.0, -0.1) == pytest.approx(0.9)
    t = mix_rewards(torch.tensor([1.0, 0.0]), torch.tensor([0.25, -0.5]), alpha=0.5)
    assert torch.equal(t, torch.tensor([0.75, -0.5]))


def test_invalid_action_penalty():
    assert invalid_action_penalty(True, 0.3) == 0.0
    assert invalid_action_penalty(False, 0.3) == -0.3
    assert torch.equal(invalid_action_penalty(torch.tensor([True, False]), 0.5), torch.tensor([0.0, -0.5]))
    with pytest.raises(ValueError, match="magnitude"):
        invalid_action_penalty(False, -1.0)
