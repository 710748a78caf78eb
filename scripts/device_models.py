"""Build, on the GPU machine (no hub, no embedded model package), the models the device check runs,
each from a config with the SmolLM2 tokenizer files that ``scripts/device_prepare.sh`` carried:

* ``tiny-random`` exactly as drmas builds it, into ``$DRMAS_CACHE_DIR`` (the recipes' tests model);
* random models of SmolLM2-135M's and SmolLM2-1.7B's shapes, into ``OUT/s135`` and ``OUT/s1700``
  (the memory-plan tests and the update bench; real weights are too large to carry), and on
  request Qwen3-8B's (``q8b``).

    python scripts/device_models.py TOKENIZER_DIR OUT [--shapes s135 s1700]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from drmas.models.loading import TINY_RANDOM, _build_tiny_random, _materialise, cache_dir  # noqa: E402
from drmas.models.loading import _CACHE_VERSION  # noqa: E402

# the published SmolLM2 configs' shapes (vocabulary 49,152, tied embeddings)
SHAPES = {
    "s135": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=1e5),
    "s1700": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                  num_attention_heads=32, num_key_value_heads=32, head_dim=64, rope_theta=1.3e5),
    # Qwen3-8B's shape (its own vocabulary size), for `device_check.sh 8b`; saved in bf16
    "q8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
                vocab_size=151936, max_position_embeddings=40960, tie_word_embeddings=False),
}
DEFAULT_SHAPES = ["s135", "s1700"]


def build_shape(name: str, tokenizer_dir: str, out: str) -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape = {"vocab_size": len(tok), "max_position_embeddings": 8192, "tie_word_embeddings": True,
             **SHAPES[name]}
    config = AutoConfig.for_model(shape.pop("model_type"), bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, **shape)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # initialised where it is fast
        dtype = torch.bfloat16 if name == "q8b" else torch.float32
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tokenizer")
    p.add_argument("out")
    p.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES, choices=list(SHAPES))
    args = p.parse_args()
    start = time.perf_counter()
    target = cache_dir() / "models" / f"{TINY_RANDOM}-{_CACHE_VERSION}"
    _materialise(target, lambda out: _build_tiny_random(out, tokenizer=args.tokenizer))
    print(f"{TINY_RANDOM}: {target}", flush=True)
    for name in args.shapes:
        out = os.path.join(args.out, name)
        if not os.path.isfile(os.path.join(out, "config.json")):
            build_shape(name, args.tokenizer, out)
        print(f"{name}: {out}", flush=True)
    print(f"models built in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
