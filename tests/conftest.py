import os

# Tests never reach a model hub: an unresolvable name must fail fast with our error.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
