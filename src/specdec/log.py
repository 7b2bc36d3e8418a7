"""The package's one logger, ``specdec``; every module logs under it (``specdec.server``, ...).

Diagnostics of the library (a fallback taken, a matrix dequantised, an unhandled server error)
go here instead of ``print``: an application embedding specdec sets their level or handlers with
``logging``. By default they reach stderr as they always did, one plain line each (warnings and
above), through a handler that writes to ``sys.stderr`` as it is at each record (so a redirected
or captured stderr gets them). Lines the user asked for (CLI errors, progress, the stats line)
stay prints in the commands.
"""

from __future__ import annotations

import logging
import sys


class _CurrentStderr(logging.StreamHandler):
    """A StreamHandler on whatever ``sys.stderr`` is when a record comes."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ sets it: always sys.stderr instead
        pass


logger = logging.getLogger("specdec")
if not any(isinstance(h, _CurrentStderr) for h in logger.handlers):
    _handler = _CurrentStderr()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(_handler)
    logger.propagate = False  # one line per record, not one more from a handler on the root logger


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (``__name__``: under ``specdec``, so through the handler above)."""
    return logging.getLogger(name)
