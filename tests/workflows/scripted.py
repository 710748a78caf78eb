"""A scripted engine: a ``generate`` function whose completions a test writes."""

from drmas.workflows.base import Completion
from drmas.records import ScriptedGenerate


class Script(ScriptedGenerate):
    """``fn(agent, prompt, i)`` writes the i-th of n completions (after the prompt's prefill);
    every call is recorded."""

    def __init__(self, fn, train=True):
        super().__init__(fn, train)
        self.calls = []

    def __call__(self, agent, prompts, n):
        self.calls.append((agent, list(prompts), n))
        return [[Completion([1], [2, 3], [-0.5, -0.5], p.prefill + self.fn(agent, p, i), "stop")
                 for i in range(n)]
                for p in prompts]

    def prompts(self, agent):
        """The last user message of every prompt ``agent`` was given, in order."""
        return [p.messages[-1][1] for a, ps, _ in self.calls if a == agent for p in ps]


class HermesScript(Script):
    """A scripted engine whose answers the endpoint parses for tool calls in the hermes format,
    with tiny-random's tokenizer (loaded once)."""

    tokenizer = None

    def tool_format(self, agent):
        if HermesScript.tokenizer is None:
            from drmas.models import load_tokenizer

            HermesScript.tokenizer = load_tokenizer("tiny-random")
        return "hermes", HermesScript.tokenizer


class TokenScript(Script):
    """A scripted engine whose completions are real tokens of ``tokenizer``: the text is encoded
    with the format's start marker as its special token (and an end-of-turn token after), and the
    completion's text is what an engine shows of them (special tokens left out)."""

    def __init__(self, fn, fmt, tokenizer, marker):
        super().__init__(fn)
        self.fmt, self.tok, self.marker = fmt, tokenizer, marker

    def tool_format(self, agent):
        return self.fmt, self.tok

    def encode(self, text):
        mark = self.tok.get_vocab()[self.marker]
        ids = []
        for k, piece in enumerate(text.split(self.marker)):
            ids += ([mark] if k else []) + (self.tok.encode(piece, add_special_tokens=False) if piece else [])
        return ids + [self.tok.eos_token_id]

    def __call__(self, agent, prompts, n):
        self.calls.append((agent, list(prompts), n))
        out = []
        for p in prompts:
            ids = [self.encode(self.fn(agent, p, i)) for i in range(n)]
            out.append([Completion([1], x, [-0.5] * len(x), self.tok.decode(x, skip_special_tokens=True))
                        for x in ids])
        return out


LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\nTo call a function, answer with JSON "
    '{"name": <name>, "parameters": <arguments>}. Functions:\n{%- for t in tools %}\n{{ t | tojson }}'
    "{%- endfor %}<|eot_id|>{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n<|python_tag|>"
    "{%- for call in message.tool_calls %}"
    '{"name": "{{ call.function.name }}", "parameters": {{ call.function.arguments | tojson }}}'
    "{%- endfor %}<|eom_id|>"
    "{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ message.content }}<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content }}<|eot_id|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}")
"""A chat template in Llama 3.1's tool format: tools as JSON in a system turn, a call after
``<|python_tag|>`` with its arguments through ``tojson``, results in an ``ipython`` turn."""


def llama3_tokenizer():
    """tiny-random's tokenizer with Llama 3's special tokens added and a Llama 3.1-style template."""
    from drmas.models import load_tokenizer

    tok = load_tokenizer("tiny-random")
    tok.add_special_tokens({"additional_special_tokens": [
        "<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]})
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


def mistral_tokenizer(tmp_path):
    """The Mistral v3 tokenizer that mistral_common ships (a pre-v11 tool format:
    ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}]``), through vLLM's wrapper."""
    import shutil
    from pathlib import Path

    import mistral_common
    from vllm.tokenizers.mistral import MistralTokenizer

    data = Path(mistral_common.__file__).parent / "data" / "mistral_instruct_tokenizer_240323.model.v3"
    shutil.copy(data, tmp_path / "tokenizer.model.v3")  # the loader takes a folder
    return MistralTokenizer.from_pretrained(str(tmp_path))
