"""Math reasoning: answer grading, an embedded arithmetic data set, loaders, and the two workflows (solver/verifier, reasoner/tool user)."""

from drmas.envs.math.data import MathTask, arithmetic_word_problems, load_math_dataset, load_math_file, math_splits
from drmas.envs.math.grading import extract_boxed, is_correct, same_answer
from drmas.envs.math.reasoner_tool_user import ReasonerToolUserWorkflow
from drmas.envs.math.solver_verifier import SolverVerifierWorkflow

__all__ = [
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
