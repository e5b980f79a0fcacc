"""Agent transcripts: the message shapes ("dialects") the helpers understand, as data.

* ``base``: what a dialect says (``Dialect``, ``Reading``, ``Window``);
* ``chat``, ``responses``, ``pydantic_ai``, ``langchain``: one per framework family;
* ``detect``: a message's dialect, per message (``classify``, ``detect``).

``docs/concepts/dialects.md`` lists the shapes, their windows and their repairs.
"""

from .base import Dialect
from .chat import CHAT
from .detect import classify, describe_shape, detect, holds_results

__all__ = ["CHAT", "Dialect", "classify", "describe_shape", "detect", "holds_results"]
