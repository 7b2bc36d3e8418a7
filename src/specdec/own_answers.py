"""The target's own answers to a prompt set the project writes: the retrieval datastore REST's gains need.

Retrieval drafts what its store continues the context with (``drafters.retrieval``). Python's
sources and help text rarely continue a chat answer the way the model does (tau 1.00-1.05 on
chat prompts, docs/retrieval.md); the model's own answers to similar questions do: the phrases it
opens with, its lists and closings. ``specdec datastore answers`` writes them, greedy and bounded,
as a ``jsonl`` source for ``specdec datastore build``; the same store ranks an FR-Spec draft's
vocabulary (``--spec-datastore`` with ``--spec-draft-vocab-size``).

The prompts are templates filled from the Python standard library (module names, help topics and
their text, built-in names) and from arithmetic, never from an evaluation set (``spec_bench*``): a
store that saw the evaluation prompts would measure their recall, not drafting. ``own_prompts(n)``
takes the families in turn, so any n covers each kind of request:

    explain   "What is Python's `argparse` module for? ..."        (question answering)
    teach     "Explain for loops in Python to someone new ..."     (open explanation)
    summarize "Summarize the following text in three sentences:..." (summarization, a help topic's text)
    math      "A shop has 27 apples. Each week it receives 8 ..."  (step-by-step arithmetic)
    builtin   "What does Python's built-in `zip` do? ..."          (short answers)
"""

from __future__ import annotations

import builtins
import json
import sys
from collections.abc import Callable, Iterator
from itertools import chain, islice, zip_longest
from pathlib import Path

SUMMARY_CHARS = 900  # a help topic's text cut at the paragraph before this many characters


def _modules() -> list[str]:
    return sorted(m for m in sys.stdlib_module_names if not m.startswith("_") and "." not in m)


def _topics() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    return [(key, topics[key]) for key in sorted(topics)]


def explain_prompts() -> Iterator[str]:
    for m in _modules():
        yield f"What is Python's `{m}` module for? Answer in a short paragraph, then give one small example."


def teach_prompts() -> Iterator[str]:
    for key, _ in _topics():
        yield f"Explain {key.replace('-', ' ')} in Python to someone new to programming."


def summarize_prompts() -> Iterator[str]:
    for _, text in _topics():
        paragraphs, kept = [p.strip() for p in text.split("\n\n") if p.strip()], []
        for p in paragraphs:
            if kept and sum(map(len, kept)) + len(p) > SUMMARY_CHARS:
                break
            kept.append(p)
        yield "Summarize the following text in three sentences:\n\n" + "\n\n".join(kept)[: 2 * SUMMARY_CHARS]


def math_prompts() -> Iterator[str]:
    """Word problems from fixed arithmetic progressions: the same list on every machine."""
    things = ("books", "apples", "coins", "stamps", "chairs", "tickets", "boxes", "plants")
    for i in range(1, 1000):
        a, b, c = 20 + 7 * i % 180, 3 + 5 * i % 40, 2 + i % 11
        yield (f"A shop has {a} {things[i % len(things)]}. Each week it receives {b} more and sells {c}. "
               "How many are left after two weeks? Explain step by step.")


def builtin_prompts() -> Iterator[str]:
    for name in sorted(n for n in dir(builtins) if not n.startswith("_") and n.islower()):
        yield f"What does Python's built-in `{name}` do? Answer briefly, with one example."


FAMILIES: tuple[Callable[[], Iterator[str]], ...] = (explain_prompts, teach_prompts, summarize_prompts, math_prompts,
                                                    builtin_prompts)


def own_prompts(n: int) -> list[str]:
    """The first ``n`` prompts, the families taken in turn (explain, teach, summarize, math, builtin, ...).

    Example: own_prompts(2) == ["What is Python's `abc` module for? ...", "Explain assert in Python ..."].
    """
    interleaved = (p for p in chain.from_iterable(zip_longest(*(f() for f in FAMILIES))) if p is not None)
    return list(islice(interleaved, n))


def answered(path: Path) -> set[str]:
    """The prompts ``path`` already holds an answer to (a run cut short resumes after them)."""
    if not path.is_file():
        return set()
    with path.open(encoding="utf-8") as f:
        return {json.loads(line)["prompt"] for line in f if line.strip()}


def write_answers(llm, prompts: list[str], max_new_tokens: int, path: Path,
                  log: Callable[[str], None] = lambda line: None) -> int:
    """Append the target's greedy answer to each prompt not yet in ``path``, one JSON line each:
    ``prompt``, ``answer`` and ``text`` (the whole chat-templated exchange, special tokens written out,
    so a store built from it holds the assistant's opening too: retrieval drafts from an answer's
    first token). Returns the number written. ``llm``: an ``LLM``; greedy output is the target's
    whatever its drafting method."""
    from specdec.config import SamplingParams

    done = answered(path)
    todo = [p for p in prompts if p not in done]
    params = SamplingParams(max_new_tokens=max_new_tokens)
    templated = bool(getattr(llm.tokenizer, "chat_template", None))
    with path.open("a", encoding="utf-8") as f:
        for i, prompt in enumerate(todo, 1):
            prompt_ids = llm.chat_prompt([{"role": "user", "content": prompt}]) if templated else llm.encode(prompt)
            out = llm.generate([prompt_ids], params)[0]
            text = llm.tokenizer.decode([*prompt_ids, *out.token_ids], skip_special_tokens=False)
            f.write(json.dumps({"prompt": prompt, "answer": out.text, "text": text}, ensure_ascii=False) + "\n")
            f.flush()
            log(f"{i}/{len(todo)}: {len(out.token_ids)} tokens")
    return len(todo)
