"""`specdec generate --show-drafts`: generated text coloured by who produced each token.

Tokens a drafter proposed and the target accepted take that drafter's colour;
the target's own tokens (recovered or bonus, or all of plain decoding) stay
plain. After the text, stderr gets a legend with each origin's token count.
Colours are written even when stdout is not a terminal: the user asked for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TextIO

from rich.console import Console
from rich.text import Text

from specdec.provenance import TARGET, TokenPiece

PALETTE = ("green", "cyan", "magenta", "yellow", "blue", "red")


class DraftPainter:
    """Writes pieces in their origin's colour and counts them, for one or more generations."""

    def __init__(self, drafters: Sequence[str], out: TextIO, err: TextIO) -> None:
        # Colours follow the configured chain's order, so a drafter keeps its colour across runs.
        self.colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(drafters)}
        self.out = Console(file=out, force_terminal=True, highlight=False, soft_wrap=True, emoji=False)
        self.err = Console(file=err, force_terminal=True, highlight=False, soft_wrap=True, emoji=False)
        self.counts: Counter[str] = Counter()

    def style(self, origin: str) -> str:
        if origin == TARGET:
            return ""
        if origin not in self.colors:  # a name outside the configured chain: give it the next colour
            self.colors[origin] = PALETTE[len(self.colors) % len(PALETTE)]
        return f"bold {self.colors[origin]}"

    def write(self, pieces: Iterable[TokenPiece]) -> None:
        text = Text()
        for p in pieces:
            self.counts[p.origin] += 1
            text.append(p.text, style=self.style(p.origin))
        self.out.print(text, end="")
        self.out.file.flush()

    def legend(self) -> None:
        """One stderr line: each origin in its colour, with its share of the tokens."""
        total = sum(self.counts.values()) or 1
        text = Text("[specdec] tokens by origin: ")
        names = [*self.colors, *sorted(set(self.counts) - set(self.colors) - {TARGET}), TARGET]
        for i, name in enumerate(names):
            if i:
                text.append(" · ")
            n = self.counts.get(name, 0)
            text.append(name, style=self.style(name))
            text.append(f" {n} ({100 * n / total:.0f}%)")
        self.err.print(text)
