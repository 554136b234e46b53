"""The shared trainer: a Llama-style model, data (an offline built-in corpus by default), and a loop
that evaluates, detects divergence and resumes exactly. Imports torch and ``backends`` only; it
reports through the ``Logger`` protocol.

    from ablate.train import RunConfig, TrainConfig, train
    result = train(RunConfig(train=TrainConfig(steps=100)))
"""

from .config import EvalPoint, RunConfig, RunResult, TrainConfig
from .data import DataConfig
from .logger import Logger, MemoryLogger, NullLogger
from .loop import train
from .model import ModelConfig

__all__ = [
    "DataConfig",
    "EvalPoint",
    "Logger",
    "MemoryLogger",
    "ModelConfig",
    "NullLogger",
    "RunConfig",
    "RunResult",
    "TrainConfig",
    "train",
]
