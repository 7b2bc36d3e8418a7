"""The demo's prompts: real code edits, where the answer copies most of the prompt.

Editing code is where drafting from the context pays: the model rewrites a function it
was given, so most of its answer already lies in the prompt for the suffix and n-gram
drafters to find. The sources are written out here (not read with ``inspect``) so every
Python version sees the same prompts, and so the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CodeEdit:
    name: str  # a few words for the report
    source: str  # the function to edit
    instruction: str  # what to change

    def message(self) -> str:
        """The user turn: the function, then the edit asked for."""
        return f"Here is a Python function:\n\n```python\n{self.source}```\n\n{self.instruction} " \
               "Output only the full function."


_QUOTE = '''def quote(s):
    """Return a shell-escaped version of the string *s*."""
    if not s:
        return "''"
    if _find_unsafe(s) is None:
        return s

    # use single quotes, and put single quotes into double quotes
    # the string $'b is then quoted as '$'"'"'b'
    return "'" + s.replace("'", "'\\"'\\"'") + "'"
'''

_INDENT = '''def indent(text, prefix, predicate=None):
    """Adds 'prefix' to the beginning of selected lines in 'text'.

    If 'predicate' is provided, 'prefix' will only be added to the lines
    where 'predicate(line)' is True. If 'predicate' is not provided,
    it will default to adding 'prefix' to all non-empty lines that do not
    consist solely of whitespace characters.
    """
    if predicate is None:
        def predicate(line):
            return line.strip()

    def prefixed_lines():
        for line in text.splitlines(True):
            yield (prefix + line if predicate(line) else line)
    return ''.join(prefixed_lines())
'''

_CHUNKS = '''def chunks(items, size):
    """Split items into lists of at most size items, in order."""
    out = []
    for start in range(0, len(items), size):
        out.append(items[start:start + size])
    return out
'''

# shlex.quote and textwrap.indent are copied from CPython (PSF License 2.0); chunks is ours.
CODE_EDITS: tuple[CodeEdit, ...] = (
    CodeEdit("rename a parameter", _QUOTE, "Rename the parameter `s` to `text`."),
    CodeEdit("add type hints", _INDENT, "Add type hints to the signature and to the inner functions."),
    CodeEdit("raise on bad input", _CHUNKS, "Make it raise ValueError when size is less than 1."),
)
