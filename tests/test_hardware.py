"""bf16 only where the hardware computes it: the unset precision, the engines' ``auto`` dtype and
the KL reference follow it; an explicit bf16 on an emulating device is kept, with a warning."""

import warnings

import pytest
import torch

import drmas.hardware as hw
from drmas.cli import resolve_precision
from drmas.modules import PolicyConfig
from drmas.modules.policy import Policy


@pytest.fixture(params=[True, False], ids=["native", "emulated"])
def native(request, monkeypatch):
    monkeypatch.setattr(hw, "bf16_is_native", lambda device="cpu": request.param)
    return request.param


def test_the_defaults_follow_the_hardware(native):
    assert hw.default_precision("cpu") == ("bf16-mixed" if native else "32-true")
    assert hw.engine_dtype("auto") == ("bfloat16" if native else "float32")
    assert hw.fast_dtype("cpu") == (torch.bfloat16 if native else torch.float32)
    assert hw.fast_dtype("cpu", torch.float64) == (torch.bfloat16 if native else torch.float64)


def test_an_unset_precision_is_chosen_and_said(native, capsys):
    assert resolve_precision(None, "cpu") == ("bf16-mixed" if native else "32-true")
    said = capsys.readouterr().out
    assert said.startswith(f"precision: {'bf16-mixed' if native else '32-true'} (this CPU computes bf16 ")
    assert ("natively" in said) == native


def test_an_explicit_choice_is_kept_and_emulated_bf16_is_warned_about(native):
    for explicit in ("32-true", "bf16-mixed", "bf16-true"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert resolve_precision(explicit, "cpu") == explicit
            engine = "bfloat16" if "bf16" in explicit else "float32"
            assert hw.engine_dtype(engine) == engine
        slow = [w for w in caught if "without native bf16" in str(w.message)]
        assert len(slow) == (0 if native or explicit == "32-true" else 2), [str(w.message) for w in caught]


def test_the_kl_reference_is_bf16_only_where_native(native):
    policy = Policy("p", PolicyConfig(model="tiny-random"), reference=True)
    assert next(policy.reference.parameters()).dtype == (torch.bfloat16 if native else torch.float32)
    assert next(policy.model.parameters()).dtype == torch.float32


def test_the_compute_device():
    assert hw.compute_device("cpu") == "cpu"
    assert hw.compute_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
