"""Offline training prompts: Python's own source and docs, topic lists, generated arithmetic.

A drafter head learns to predict the target's *own* responses (self-distillation),
so the prompts only need to cover the kinds of requests users send; they never
come from an evaluation set (the Spec-Bench prompts in ``bench/workloads`` stay
unseen). Every source here ships with Python or is written below:

- the standard library's source, read with ``ast`` (nothing is imported): functions
  to explain, document, test or rewrite, and docstrings to summarise or translate;
- ``pydoc_data.topics``: the language reference's sections, to explain or summarise;
- topic lists crossed with task templates (stories, emails, advice, comparisons...);
- arithmetic word problems with random numbers;
- questions the target writes itself about a topic (``self_instruct_requests``).

``build_prompts(n, seed)`` mixes them deterministically: the same seed gives the
same list, so a resumed run continues where the last one stopped.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

TOPICS = (
    "the ocean", "volcanoes", "the Roman Empire", "photosynthesis", "black holes", "the French Revolution",
    "bees", "climate change", "the internet", "jazz music", "chess", "the human heart", "rainforests",
    "electric cars", "the Moon landing", "ancient Egypt", "vaccines", "coffee", "the stock market",
    "renewable energy", "dinosaurs", "the printing press", "earthquakes", "the immune system", "origami",
    "machine learning", "the Great Wall of China", "gardening", "sleep", "friendship", "time management",
    "public speaking", "recycling", "the water cycle", "honey", "bicycles", "the Olympic Games",
    "quantum computers", "Shakespeare", "the Renaissance", "mountains", "deserts", "birds migrating",
    "a small bakery", "learning a new language", "a job interview", "moving to a new city", "a rainy day",
    "space travel", "robots", "the Industrial Revolution", "democracy", "inflation", "a lighthouse",
    "penguins", "the Amazon river", "plastic pollution", "the solar system", "artificial intelligence",
    "a marathon", "baking bread", "a haunted house", "a lost key", "a birthday party", "tea ceremonies",
    "cryptography", "the Silk Road", "glaciers", "coral reefs", "the history of writing", "the piano",
    "video games", "a road trip", "a family dinner", "a detective", "a dragon", "a time traveler",
    "a library", "a farmer", "a city at night", "winter", "autumn leaves", "a first day at school",
    "budgeting", "healthy eating", "exercise", "meditation", "open source software", "databases",
    "the theory of evolution", "magnets", "electricity", "the speed of light", "prime numbers",
    "probability", "statistics", "geometry", "the Pythagorean theorem", "supply and demand",
    "the Cold War", "the Vikings", "the Mayan civilization", "the Eiffel Tower", "Mount Everest",
    "antibiotics", "DNA", "the brain", "memory", "emotions", "social media", "smartphones", "email etiquette",
    "customer service", "a startup", "teamwork", "leadership", "negotiation", "writing a resume",
)

TOPIC_TASKS = (
    "Write a short story about {t}.",
    "Write a poem about {t}.",
    "Explain {t} to a ten-year-old.",
    "Give me five interesting facts about {t}.",
    "Write a persuasive paragraph about why people should care about {t}.",
    "What are the pros and cons of {t}?",
    "Write a short blog post introduction about {t}.",
    "Summarize the most important things to know about {t} in a few sentences.",
    "Write a dialogue between two friends talking about {t}.",
    "Give three practical tips related to {t}.",
    "Write a formal email to a colleague about {t}.",
    "Describe {t} in vivid detail.",
    "What is a common misconception about {t}? Explain why it is wrong.",
    "Write a haiku about {t}, then explain it.",
    "Compare {t} and {u}: how are they similar and how are they different?",
    "Imagine you are a tour guide. Introduce {t} to a group of visitors.",
    "Write a short news report about {t}.",
    "Create a quiz with three questions about {t}, with answers.",
    "Write a step-by-step plan for learning about {t}.",
    "Explain the history of {t} briefly.",
)

CODE_TASKS = (
    "Explain what this Python code does:\n\n```python\n{code}\n```",
    "Write a docstring for this Python function:\n\n```python\n{code}\n```",
    "Write unit tests with pytest for this function:\n\n```python\n{code}\n```",
    "Rewrite this Python code to make it simpler and more readable:\n\n```python\n{code}\n```",
    "Add type hints to this Python function:\n\n```python\n{code}\n```",
    "Find possible bugs or edge cases in this code:\n\n```python\n{code}\n```",
)

DOC_TASKS = (
    "Summarize this documentation in two sentences:\n\n{doc}",
    "Explain this documentation in simple words:\n\n{doc}",
    "Write a short Python example that uses what this documentation describes:\n\n{doc}",
    "Translate this text into {lang}:\n\n{doc}",
    "Write three questions a student might ask after reading this, and answer them:\n\n{doc}",
)

REFERENCE_TASKS = (
    "Explain this part of the Python language reference in simple terms:\n\n{doc}",
    "Summarize the key points of this text:\n\n{doc}",
    "Give a short code example that illustrates this:\n\n{doc}",
)

LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese")

SELF_INSTRUCT = "Write one question that a curious person might ask about {t}. Write only the question."

CODE_CHARS = 1200  # long functions are cut: prompts stay well inside the context
DOC_CHARS = 900


def stdlib_snippets(max_files: int = 200, seed: int = 0) -> tuple[list[str], list[str]]:
    """(function sources, docstrings) from the standard library's .py files, parsed with ``ast``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py")) + sorted(root.glob("*/*.py"))
    files = [f for f in files if "test" not in f.parts and "site-packages" not in f.parts]
    random.Random(seed).shuffle(files)
    code, docs = [], []
    for path in files[:max_files]:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
                text = ast.get_source_segment(source, node) or ""
                if 120 <= len(text) <= CODE_CHARS:
                    code.append(text)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)):
                doc = ast.get_docstring(node)
                if doc and 200 <= len(doc):
                    docs.append(doc[:DOC_CHARS])
    return code, docs


def reference_sections() -> list[str]:
    """The language reference's sections (``pydoc_data.topics``), cut to a prompt's size."""
    from pydoc_data.topics import topics

    return [text.strip()[:DOC_CHARS] for _, text in sorted(topics.items()) if len(text.strip()) > 200]


def arithmetic_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 12)
    item = rng.choice(["apples", "books", "pencils", "tickets", "cookies", "stamps", "marbles"])
    name = rng.choice(["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana"])
    templates = (
        f"{name} has {a} {item}. {name} buys {b} more and then gives away {c}. How many {item} does {name} have now?",
        f"A box holds {c} {item}. How many boxes are needed for {a * c + b} {item}?",
        f"{name} reads {b} pages a day. How many days does it take to read a book of {a * b} pages?",
        f"A shop sells {item} at {c} dollars each. {name} buys {b} of them and pays with a {100 * (b * c // 100 + 1)} "
        f"dollar bill. How much change does {name} get?",
        f"What is {a} times {b}, plus {c}?",
        f"A train travels at {a} km per hour for {c} hours. How far does it go?",
    )
    return rng.choice(templates) + " Solve it step by step."


def topic_request(rng: random.Random) -> str:
    t, u = rng.sample(TOPICS, 2)
    return rng.choice(TOPIC_TASKS).format(t=t, u=u)


def build_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` user requests mixed from every source (deterministic in ``seed``)."""
    rng = random.Random(seed)
    code, docs = stdlib_snippets(seed=seed)
    refs = reference_sections()
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.40:
            out.append(topic_request(rng))
        elif kind < 0.60 and code:
            out.append(rng.choice(CODE_TASKS).format(code=rng.choice(code)))
        elif kind < 0.75 and docs:
            out.append(rng.choice(DOC_TASKS).format(doc=rng.choice(docs), lang=rng.choice(LANGUAGES)))
        elif kind < 0.85 and refs:
            out.append(rng.choice(REFERENCE_TASKS).format(doc=rng.choice(refs)))
        else:
            out.append(arithmetic_problem(rng))
    return out


def self_instruct_requests(n: int, seed: int = 0) -> list[str]:
    """Requests that ask the target to write a question itself (its answer becomes a prompt)."""
    rng = random.Random(seed + 1)
    return [SELF_INSTRUCT.format(t=rng.choice(TOPICS)) for _ in range(n)]


def read_prompt_file(path: str | Path) -> Iterator[str]:
    """User-given prompts: a JSONL file of {"prompt": ...} objects, or plain text with one per line."""
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            row = json.loads(line)
            text = row.get("prompt") if isinstance(row, dict) else None
            if isinstance(text, str) and text.strip():
                yield text
        else:
            yield line.strip()
