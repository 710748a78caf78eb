"""The first-minute pass's check of a weight transfer, in its parts: the sums each side takes and
the comparison that names a tensor that did not arrive as sent (the whole pass on real runs:
tests/recipes/test_preflight.py)."""

import torch

from drmas.engines.base import tensor_sums
from drmas.modules.preflight import compare_sums, sent_sums


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8, bias=False))


def test_the_sums_are_taken_in_the_transfers_dtype():
    net = model()
    assert tensor_sums(torch.tensor([1.0, -2.0, 3.0])) == (2.0, 14.0)
    sent = sent_sums(net, torch.bfloat16)
    weight = net[0].weight.detach().to(torch.bfloat16).double()
    assert sent["0.weight"] == (float(weight.sum()), float(weight.square().sum()))
    assert sent["0.weight"] != sent_sums(net, None)["0.weight"]  # fp32's differ from bf16's
    assert list(sent) == list(net.state_dict())


def test_a_tensor_altered_or_missing_is_named_and_an_exact_copy_passes():
    net = model()
    sent = sent_sums(net, torch.bfloat16)
    numels = {n: t.numel() for n, t in net.state_dict().items()}
    # what the engine would sum, had it received the same bytes in another order
    received = {n: tensor_sums(t.detach().to(torch.bfloat16).flip(0)) for n, t in net.state_dict().items()}
    assert compare_sums(sent, received, numels) == []
    altered = dict(received)
    bad = net[0].weight.detach().to(torch.bfloat16).clone()
    bad[0, 0] += 0.25  # one value of 2,048
    altered["0.weight"] = tensor_sums(bad)
    del altered["1.weight"]
    wrong = compare_sums(sent, altered, numels)
    assert len(wrong) == 2
    assert wrong[0].startswith("0.weight arrived with sum ") and ", sent " in wrong[0]
    assert wrong[1] == "1.weight never arrived"
