"""Agent transcripts: the message shapes ("dialects") the helpers understand, as data.

* ``base``: what a dialect says (``Dialect``, ``Reading``, ``Window``);
* ``chat``, ``responses``, ``pydantic_ai``, ``langchain``: one per framework family;
* ``detect``: a message's dialect, per message (``classify``, ``detect``).

``docs/concepts/dialects.md`` lists the shapes, their windows and their repairs.
"""

from .base import Dialect, Reading, Window
from .chat import ANTHROPIC, CHAT
from .detect import classify, describe_shape, detect, holds_results
from .langchain import LANGCHAIN
from .pydantic_ai import PYDANTIC_AI
from .responses import RESPONSES

__all__ = [
    "ANTHROPIC",
    "CHAT",
    "LANGCHAIN",
    "PYDANTIC_AI",
    "RESPONSES",
    "Dialect",
    "Reading",
    "Window",
    "classify",
    "describe_shape",
    "detect",
    "holds_results",
]
