"""Math reasoning: answer grading, an embedded arithmetic data set, and loaders for real sets."""

from drmas.envs.math.grading import extract_boxed, is_correct

__all__ = ["extract_boxed", "is_correct"]
