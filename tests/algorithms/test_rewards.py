import pytest
import torch

from drmas.algorithms import format_term, mix_rewards


def test_mix_rewards_floats_and_tensors():
    assert mix_rewards(1.0, 0.5, alpha=2.0) == 2.5
    assert mix_rewards(1.0, -0.1) == pytest.approx(0.9)
    t = mix_rewards(torch.tensor([1.0, 0.0]), torch.tensor([0.25, -0.5]), alpha=0.5)
    assert torch.equal(t, torch.tensor([0.75, -0.5]))


def test_format_term_is_minus_the_format_penalty_for_an_invalid_action():
    assert format_term(True, 0.3) == 0.0
    assert format_term(False, 0.3) == -0.3
    assert torch.equal(format_term(torch.tensor([True, False]), 0.5), torch.tensor([0.0, -0.5]))
    with pytest.raises(ValueError, match="magnitude"):
        format_term(False, -1.0)
