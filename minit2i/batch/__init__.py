"""Evaluation-size generation: a prompt file to GenEval's layout, resumable, on one machine or a
Ray cluster (README.md in this folder; docs/evaluation.md)."""

from .command import add_parser
from .driver import Summary, run_batch
from .worker import Spec

__all__ = ["Spec", "Summary", "add_parser", "run_batch"]
