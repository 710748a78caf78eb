"""Math reasoning: answer grading, an embedded arithmetic data set, loaders, and workflows."""

from drmas.envs.math.data import MathTask, arithmetic_word_problems, load_math_dataset, load_math_file
from drmas.envs.math.grading import extract_boxed, is_correct
from drmas.envs.math.workflows import SolverVerifierWorkflow

__all__ = [
    "MathTask",
    "SolverVerifierWorkflow",
    "arithmetic_word_problems",
    "extract_boxed",
    "is_correct",
    "load_math_dataset",
    "load_math_file",
]
