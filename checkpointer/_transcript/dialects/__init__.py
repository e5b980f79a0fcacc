"""The message shapes ("dialects") the transcript helpers understand, as data."""

from .base import Dialect
from .chat import CHAT
from .detect import classify, describe_shape, detect, holds_results

__all__ = ["CHAT", "Dialect", "classify", "describe_shape", "detect", "holds_results"]
