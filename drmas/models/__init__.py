"""Model loading: embedded (packaged, offline) models, a tiny random model, local/hub models."""

from drmas.models.loading import (EMBEDDED_MODELS, cache_dir, load_causal_lm, load_tokenizer,
                                  resolve_model_path)

__all__ = ["EMBEDDED_MODELS", "cache_dir", "load_causal_lm", "load_tokenizer", "resolve_model_path"]
