"""``--config NAME`` takes a shipped config by name; a file of that name wins; an unknown name is
refused naming the shipped ones (``drmas.cli``, ``drmas.checkout``)."""

import pytest

from drmas.checkout import config_path, shipped_configs
from drmas.cli import ConfigurationError, _resolve_argv_configs


def test_a_shipped_config_by_name_a_file_first_and_an_unknown_name_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert {"qwen3_8b", "smollm2_135m_cpu", "tiny_random"} <= set(shipped_configs())
    assert _resolve_argv_configs(["fit", "--config", "qwen3_8b", "--print_config"]) == [
        "fit", "--config", config_path("qwen3_8b"), "--print_config"]
    assert _resolve_argv_configs(["--config=tiny_random.yaml"]) == ["--config=" + config_path("tiny_random")]
    (tmp_path / "qwen3_8b").write_text("trainer: {max_epochs: 1}\n")
    assert _resolve_argv_configs(["--config", "qwen3_8b"]) == ["--config", "qwen3_8b"]  # the file
    assert _resolve_argv_configs(["--config", "{trainer: {max_epochs: 1}}"])[1].startswith("{")  # inline YAML
    refused = "--config qwen4: no such file, and no shipped config 'qwen4'; the shipped configs: .*qwen3_8b"
    with pytest.raises(ConfigurationError, match=refused):
        _resolve_argv_configs(["fit", "--config", "qwen4"])
