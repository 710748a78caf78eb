"""Which engine ``--model.engine`` selects: by name, or ``auto`` by the engines' own preference
and availability; and how an engine's settings are read from one namespace."""

from dataclasses import dataclass

import pytest

from drmas.engines import (ENGINES, HFEngine, VLLMEngine, VLLMSettings, parse_settings, resolve_engine,
                           vllm_available)


@dataclass
class FastSettings:
    width: int = 2
    """A setting of this engine alone."""


class Fast(HFEngine):
    settings_type = FastSettings
    auto_preference = 99
    installed = True

    @classmethod
    def available(cls):
        return cls.installed


@pytest.fixture
def registered():
    ENGINES.register("fast")(Fast)
    ENGINES.register("plain_subclass")(type("PlainSubclass", (VLLMEngine,), {}))
    yield
    ENGINES.unregister("fast")
    ENGINES.unregister("plain_subclass")
    Fast.installed = True


def test_auto_takes_the_available_engine_the_engines_prefer(registered):
    assert resolve_engine("auto")[0] == "fast"  # 99 over vLLM's 10 and HF's 0
    Fast.installed = False  # not installed here: the next in preference
    assert resolve_engine("auto")[0] == ("vllm" if vllm_available() else "hf")
    assert resolve_engine("plain_subclass")[0] == "plain_subclass"  # by name only: nothing inherited
    with pytest.raises(ValueError, match=r"engine must be 'auto' or one of \[.*'fast'.*\], got 'sglang'"):
        resolve_engine("sglang")


def test_each_engine_reads_its_own_keys_and_refuses_what_no_engine_declares(registered):
    raw = {"width": 3, "kv_cache_gib": 1}  # one namespace: Fast's key and vLLM's
    assert parse_settings("fast", Fast, raw) == FastSettings(width=3)
    assert parse_settings("vllm", VLLMEngine, raw) == VLLMSettings(kv_cache_gib=1.0)  # int taken as float
    assert parse_settings("hf", HFEngine, raw) is None  # the HF engine takes none
    base = VLLMSettings(max_model_len=512)
    assert parse_settings("vllm", VLLMEngine, {"dtype": "float32"}, "x", base) == VLLMSettings(
        dtype="float32", max_model_len=512)
    with pytest.raises(ValueError, match=r"unknown setting 'widht' of engine 'fast' in "
                                         r"--model.engine_settings; known: \['width'\]"):
        parse_settings("fast", Fast, {"widht": 3})
    with pytest.raises(ValueError, match=r"setting 'width' of engine 'fast' in policy p must be int, "
                                         r"got '3'"):
        parse_settings("fast", Fast, {"width": "3"}, "policy p")
