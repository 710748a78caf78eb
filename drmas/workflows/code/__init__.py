"""AT-GRPO's code workflow: a coder and a tester, programs judged in the sandbox (docs/code.md)."""

from drmas.workflows.code.judge import Judge, Verdict, pass_rate
from drmas.workflows.code.loaders import CODE_DATASETS, embedded_problems, load_code_dataset, load_code_file
from drmas.workflows.code.task import CodeTask, TestCase
from drmas.workflows.code.workflow import CoderTesterWorkflow, parse_test_cases

__all__ = ["CODE_DATASETS", "CodeTask", "CoderTesterWorkflow", "Judge", "TestCase", "Verdict",
           "embedded_problems", "load_code_dataset", "load_code_file", "parse_test_cases", "pass_rate"]
