"""Math reasoning: answer grading, an embedded arithmetic data set, loaders, and the two workflows
(solver/verifier, reasoner/tool user)."""

from drmas.workflows.math.grading import extract_boxed, is_correct, same_answer
from drmas.workflows.math.loaders import MATH_DATASETS, load_math_dataset, load_math_file
from drmas.workflows.math.problems import arithmetic_word_problems
from drmas.workflows.math.reasoner_tool_user import ReasonerToolUserWorkflow
from drmas.workflows.math.solver_verifier import SolverVerifierWorkflow
from drmas.workflows.math.splits import math_splits
from drmas.workflows.math.task import MathTask

__all__ = [
    "MATH_DATASETS",
    "MathTask",
    "ReasonerToolUserWorkflow",
    "SolverVerifierWorkflow",
    "arithmetic_word_problems",
    "extract_boxed",
    "is_correct",
    "load_math_dataset",
    "load_math_file",
    "math_splits",
    "same_answer",
]
