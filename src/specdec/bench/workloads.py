"""Benchmark workloads: conversations whose user turns are fixed and whose answers come from the model.

A workload is a list of conversations; each user turn becomes one request. A
later turn's prompt holds the earlier turns' answers, so those prompts exist
only after a reference run has produced the answers (``bench.harness`` builds
them from specdec's plain greedy output, and every method and peer then gets
the same token ids).

Shipped workloads:

- the six Spec-Bench groups (``spec_bench_dev.jsonl``, Apache-2.0, see NOTICE.md):
  ``mt_bench`` (two-turn MT-bench questions of every category), ``translation``,
  ``summarization``, ``qa``, ``math_reasoning``, ``rag``;
- ``code_edit``: rewrite a Python standard-library function (source taken with
  ``inspect.getsource``) with a small edit; the answer copies most of the prompt;
- ``agentic``: multi-turn tool-calling and revise-your-answer episodes whose
  outputs repeat across turns and requests (suffix caches across requests help);
- ``creative``: open-ended writing sampled at temperature 1.0, where drafts are
  rarely accepted and speculation should be switched off.
"""

from __future__ import annotations

import importlib
import inspect
import json
import textwrap
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

SPEC_BENCH_FILE = "spec_bench_dev.jsonl"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_GROUPS = ("translation", "summarization", "qa", "math_reasoning", "rag")

TITLES = {
    "mt_bench": "MT-bench",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "QA",
    "math_reasoning": "Math",
    "rag": "RAG",
    "code_edit": "Code edit",
    "agentic": "Agentic",
    "creative": "Creative",
}
WORKLOAD_NAMES = tuple(TITLES)
CREATIVE_TEMPERATURE = 1.0


@dataclass(frozen=True)
class Conversation:
    """User turns of one conversation; turn k's prompt holds the answers to turns < k."""

    id: str
    turns: tuple[str, ...]
    system: str | None = None
    category: str = ""

    def messages(self, turn: int, answers: list[str]) -> list[dict]:
        """Chat messages for ``turn``, given the answers to the turns before it."""
        if len(answers) != turn:
            raise ValueError(f"turn {turn} needs {turn} earlier answers, got {len(answers)}")
        out = [{"role": "system", "content": self.system}] if self.system else []
        for user, answer in zip(self.turns[:turn], answers, strict=True):
            out += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        return [*out, {"role": "user", "content": self.turns[turn]}]


@dataclass(frozen=True)
class Workload:
    name: str
    conversations: tuple[Conversation, ...]
    temperature: float | None = None  # fixed sampling temperature; None: the --temperatures grid
    title: str = ""

    @property
    def num_requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)

    def limited(self, limit: int | None, max_turns: int | None = None) -> Workload:
        """At most ``limit`` conversations, spread evenly over the list, of at most ``max_turns`` turns each."""
        convs = self.conversations
        if limit is not None and limit < len(convs):
            convs = tuple(convs[i * len(convs) // limit] for i in range(limit))
        if max_turns is not None:
            convs = tuple(replace(c, turns=c.turns[:max_turns]) for c in convs)
        return replace(self, conversations=convs)


def _data_path(name: str):
    return resources.files("specdec.bench") / "workloads" / name


def read_jsonl(path) -> list[dict]:
    """Rows of a JSONL file; ``path`` is a Path or a package resource (anything with read_text)."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: invalid JSON ({exc.msg})") from None
    return rows


def _conversation(row: dict, where: str) -> Conversation:
    """A conversation from {"turns": [...]} or {"prompt": "..."}, plus optional id, system, category."""
    if not isinstance(row, dict):
        raise ValueError(f'{where}: expected an object with "turns" or "prompt"')
    turns = row.get("turns", [row["prompt"]] if "prompt" in row else None)
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise ValueError(f'{where}: expected "turns" (a list of non-empty strings) or a "prompt" string')
    ident = str(row.get("id", row.get("question_id", where)))
    return Conversation(ident, tuple(turns), row.get("system"), str(row.get("category", "")))


def load_spec_bench(group: str) -> Workload:
    rows = read_jsonl(_data_path(SPEC_BENCH_FILE))
    wanted = MT_BENCH_CATEGORIES if group == "mt_bench" else (group,)
    convs = tuple(_conversation(r, f"{SPEC_BENCH_FILE}#{r['question_id']}") for r in rows
                  if r["category"] in wanted)
    if not convs:
        raise ValueError(f"no Spec-Bench questions for group {group!r}")
    return Workload(group, convs, title=TITLES[group])


# (module, qualified name, edit). Edits keep most of the function, so the answer
# mostly copies the prompt: the case prompt-lookup drafting is made for.
CODE_EDITS = (
    ("textwrap", "indent", "rename_param"),
    ("shlex", "quote", "type_hints"),
    ("string", "capwords", "rename_function"),
    ("statistics", "median", "strip_docs"),
    ("colorsys", "rgb_to_hsv", "rename_param"),
    ("html", "escape", "type_hints"),
    ("fnmatch", "filter", "rename_function"),
    ("textwrap", "shorten", "strip_docs"),
    ("collections", "Counter.most_common", "rename_param"),
    ("shutil", "copyfileobj", "type_hints"),
    ("statistics", "mode", "rename_function"),
    ("calendar", "leapdays", "strip_docs"),
)


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def code_edit_instruction(func, edit: str) -> str:
    """The edit request for ``func``; names come from its signature, so the text is reproducible."""
    name = func.__name__
    params = [p for p in inspect.signature(func).parameters if p not in ("self", "cls")]
    if edit == "rename_param":
        old = params[0]
        return f"Rewrite this function, renaming the parameter `{old}` to `{old}_value` everywhere in it."
    if edit == "type_hints":
        return "Rewrite this function, adding type hints to every parameter and to the return value."
    if edit == "rename_function":
        return f"Rewrite this function, renaming it from `{name}` to `{name}_v2`; change nothing else."
    if edit == "strip_docs":
        return "Rewrite this function without its docstring and comments; keep the code identical."
    raise ValueError(f"unknown edit {edit!r}")


def load_code_edit() -> Workload:
    convs = []
    for module, qualname, edit in CODE_EDITS:
        func = _resolve(module, qualname)
        source = textwrap.dedent(inspect.getsource(func)).rstrip()  # methods lose their class indent
        prompt = (f"{code_edit_instruction(func, edit)} Output the full function.\n\n"
                  f"```python\n{source}\n```")
        convs.append(Conversation(f"{module}.{qualname}:{edit}", (prompt,), category=edit))
    return Workload("code_edit", tuple(convs), title=TITLES["code_edit"])


def load_packaged(name: str, temperature: float | None = None) -> Workload:
    file = _data_path(f"{name}.jsonl")
    convs = tuple(_conversation(r, f"{name}.jsonl:{i + 1}") for i, r in enumerate(read_jsonl(file)))
    return Workload(name, convs, temperature, TITLES[name])


def load_workload(name: str) -> Workload:
    if name == "mt_bench" or name in SPEC_BENCH_GROUPS:
        return load_spec_bench(name)
    if name == "code_edit":
        return load_code_edit()
    if name == "agentic":
        return load_packaged("agentic")
    if name == "creative":
        return load_packaged("creative", CREATIVE_TEMPERATURE)
    raise ValueError(f"unknown workload {name!r}; choose from: {', '.join(WORKLOAD_NAMES)}")


def first_turns(names: list[str], n: int) -> list[list[dict]]:
    """The first user turn (chat messages) of ``n`` conversations, spread evenly over the workloads ``names`` in
    order: what the measuring scripts prompt with."""
    groups = [load_workload(name).conversations for name in names]
    per_group = -(-n // len(groups))
    return [c.messages(0, []) for g in groups for c in g[:per_group]][:n]


def load_workload_file(path: str | Path) -> Workload:
    """A user workload: JSONL rows {"prompt": ...} or {"turns": [...], "system"?, "id"?, "temperature"?}.

    A "temperature" on the first row fixes the workload's temperature (like ``creative``).
    """
    path = Path(path)
    try:
        rows = read_jsonl(path)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    convs = tuple(_conversation(r, f"{path.name}:{i + 1}") for i, r in enumerate(rows))
    temperature = rows[0].get("temperature")
    return Workload(path.stem, convs, None if temperature is None else float(temperature), path.stem)
