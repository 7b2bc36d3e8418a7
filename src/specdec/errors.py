"""Errors shared across modules: raised in one place, caught and reported in another.

A leaf module (it imports nothing from specdec), so any module can import it without
creating a cycle. Errors a single module raises and its direct caller catches by name
(``QueueFullError`` in the scheduler, ``APIError`` in the server, ``GreedyMismatchError``
in the bench) stay with that module.
"""

from __future__ import annotations


class ModelLoadError(Exception):
    """A model could not be found or read; the message is one line for the user."""


class UsageError(Exception):
    """Bad input from the user on the command line: printed as one line, exit status 2."""


class ContextOverflowError(ValueError):
    """The prompt does not fit in the model's context."""
