"""Self-distillation data: the target's own responses, with its hidden states cached to disk.

For each prompt the target generates a response (greedy for most, sampled for
some, so the data covers both decoding modes) with plain batched decoding on the
runner that will later verify drafts: the hidden states of every token come from
the very passes that produce the response, so the cached features are the ones
the drafter sees at inference, and no second teacher-forcing pass is needed.

On disk (``DIR/data``): ``manifest.json`` and shards ``shard-00000.safetensors``
holding, for S sequences of n_s tokens each (rows aligned with tokens; the last
token of a sequence is never run, so its rows are zero and never read)::

    tokens        [sum n_s]       int32
    offsets       [S + 1]         int64   sequence s is rows offsets[s]:offsets[s+1]
    prompt_lens   [S]             int32
    greedy        [S]             int8    1 = greedy response (its tokens are the target's argmax)
    tags          [S]             int64   the prompt's index
    hidden.<i>    [sum n_s, H]    float16 after target layer i (``ModelRunner.run`` indexing)
    hidden.final  [sum n_s, H]    float16 final normed state (gives the target's logits)

Generation is resumable: the manifest counts the prompts consumed, and a later run
with the same seed continues with the next ones.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.config import SamplingParams
from specdec.runners.base import ModelRunner, SeqInput
from specdec.sampling import make_generator, probs_from_logits, sample
from specdec.text import decode, encode_chat

SAMPLED = SamplingParams(temperature=0.7, top_p=0.95)  # the sampled share of responses
SHARD_SEQS = 32


@dataclass
class Request:
    prompt_ids: list[int]
    seed: int | None = None  # None = greedy
    tag: int = 0  # handed back with the result: sequences finish out of order


@dataclass
class Generated:
    """One finished sequence: prompt + response, and the target's states of every token but the last."""

    token_ids: list[int]
    prompt_len: int
    hidden: dict[int, torch.Tensor]  # layer (-1 = final normed) -> [len(token_ids) - 1, H]
    tag: int = 0
    greedy: bool = True


@dataclass
class _Active:
    slot: int
    token_ids: list[int]
    prompt_len: int
    generator: torch.Generator | None  # None = greedy
    tag: int
    rows: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def add(self, hidden: dict[int, torch.Tensor]) -> None:
        for layer, h in hidden.items():
            self.rows.setdefault(layer, []).append(h.to(torch.float16).cpu())


def generate_batched(
    runner: ModelRunner,
    requests: Iterable[Request],
    layers: Sequence[int],
    max_new_tokens: int,
    batch_size: int,
    on_done: Callable[[Generated], None],
) -> None:
    """Decode every request with up to ``batch_size`` sequences at a time (plain decoding).

    ``layers``: target layers whose hidden states are kept (-1 added: the final state);
    empty keeps none (e.g. writing questions). Calls ``on_done`` as each sequence ends.
    """
    want = tuple(sorted({*layers, -1} - {-1})) + (-1,) if layers else ()
    pending: Iterator[Request] = iter(requests)
    active: list[_Active] = []
    exhausted = False
    while active or not exhausted:
        new: list[_Active] = []
        while not exhausted and len(active) + len(new) < batch_size:
            item = next(pending, None)
            if item is None:
                exhausted = True
                break
            ids = item.prompt_ids
            if not 2 <= len(ids) < runner.max_seq_len - 2:
                continue
            gen = None if item.seed is None else make_generator(item.seed, runner.device)
            new.append(_Active(runner.allocate(), list(ids), len(ids), gen, item.tag))
        if new:
            out = runner.run([SeqInput(a.slot, a.token_ids[:-1], all_logits=False) for a in new], want)
            for a, hidden in zip(new, out.hidden or [[]] * len(new), strict=True):
                a.add(dict(zip(want, hidden, strict=True)))
            active += new
        if not active:
            continue
        out = runner.run([SeqInput(a.slot, a.token_ids[-1:]) for a in active], want)
        still = []
        for i, a in enumerate(active):
            if want:
                a.add(dict(zip(want, out.hidden[i], strict=True)))
            logits = out.logits[i][-1:]
            if a.generator is None:
                token = int(logits.argmax(-1))
            else:
                token = int(sample(probs_from_logits(logits, SAMPLED), a.generator)[0])
            a.token_ids.append(token)
            done = (
                token in runner.eos_token_ids
                or len(a.token_ids) - a.prompt_len >= max_new_tokens
                or runner.lengths[a.slot] + 2 >= runner.max_seq_len
            )
            if done:
                runner.free(a.slot)
                hidden = {layer: torch.cat(rows) for layer, rows in a.rows.items()}
                on_done(Generated(a.token_ids, a.prompt_len, hidden, a.tag, a.generator is None))
            else:
                still.append(a)
        active = still


class ShardWriter:
    """Collects generated sequences and writes them as shards next to a manifest."""

    def __init__(self, folder: Path, layers: Sequence[int], meta: dict) -> None:
        self.folder = folder
        self.layers = tuple(layers)
        folder.mkdir(parents=True, exist_ok=True)
        self.manifest = read_manifest(folder) or {
            "layers": list(self.layers), "shards": [], "prompts_done": 0, "num_tokens": 0, **meta,
        }
        if tuple(self.manifest["layers"]) != self.layers:
            raise ValueError(f"{folder} holds layers {self.manifest['layers']}, not {list(self.layers)}")
        for key in ("source", "seed"):  # continuing another prompt list would skip or repeat prompts
            if key in meta and key in self.manifest and meta[key] != self.manifest[key]:
                raise ValueError(f"{folder} was collected with {key} {self.manifest[key]!r}, not {meta[key]!r}")
        self.buffer: list[Generated] = []

    def add(self, item: Generated) -> None:
        self.buffer.append(item)

    def flush(self, prompts_done: int) -> None:
        """Write the buffered sequences as one shard; record that ``prompts_done`` prompts are consumed."""
        if self.buffer:
            name = f"shard-{len(self.manifest['shards']):05d}.safetensors"
            save_file(pack(self.buffer, self.layers), str(self.folder / name))
            self.manifest["shards"].append(name)
            self.manifest["num_tokens"] += sum(len(g.token_ids) for g in self.buffer)
            self.buffer = []
        self.manifest["prompts_done"] = prompts_done
        tmp = self.folder / "manifest.json.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=1))
        tmp.replace(self.folder / "manifest.json")  # atomic: a killed run leaves the old manifest


def pack(items: list[Generated], layers: Sequence[int]) -> dict[str, torch.Tensor]:
    """Sequences -> the shard tensors of the module docstring."""
    lengths = [len(g.token_ids) for g in items]
    offsets = torch.zeros(len(items) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    out = {
        "tokens": torch.tensor([t for g in items for t in g.token_ids], dtype=torch.int32),
        "offsets": offsets,
        "prompt_lens": torch.tensor([g.prompt_len for g in items], dtype=torch.int32),
        "greedy": torch.tensor([g.greedy for g in items], dtype=torch.int8),
        "tags": torch.tensor([g.tag for g in items], dtype=torch.int64),
    }
    for layer in (*layers, -1):
        rows = []
        for g in items:
            h = g.hidden[layer]
            rows += [h, torch.zeros(1, h.shape[1], dtype=torch.float16)]  # the last token's row
        out[_hidden_key(layer)] = torch.cat(rows).contiguous()
    return out


def _hidden_key(layer: int) -> str:
    return "hidden.final" if layer == -1 else f"hidden.{layer}"


def read_manifest(folder: Path) -> dict | None:
    path = folder / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


@dataclass
class Sample:
    token_ids: torch.Tensor  # [n] int64
    prompt_len: int
    greedy: bool
    features: torch.Tensor  # [n, len(layers) * H] float16: the chosen layers' states, concatenated
    final: torch.Tensor  # [n, H] float16


class SampleStore:
    """Read access to every cached sequence under a data folder (shards opened lazily).

    ``layers``: the target layers a sample's features concatenate, any subset of those cached
    (default all), so one collection serves heads that read different layers; -1 is the final
    normed state (always cached: what an MTP module reads).
    """

    def __init__(self, folder: Path, layers: Sequence[int] | None = None) -> None:
        self.folder = folder
        self.manifest = read_manifest(folder)
        if self.manifest is None:
            raise FileNotFoundError(f"no training data in {folder} (manifest.json missing)")
        cached = tuple(self.manifest["layers"])
        self.layers = cached if layers is None else tuple(layers)
        if missing := [i for i in self.layers if i not in (*cached, -1)]:
            raise ValueError(f"{folder} holds the states of target layers {list(cached)}, not of {missing}")
        self.index: list[tuple[str, int, int, int]] = []  # shard, start row, end row, prompt_len
        self.greedy: list[bool] = []
        self.tags: list[int] = []
        for name in self.manifest["shards"]:
            with safe_open(str(folder / name), framework="pt") as f:
                offsets = f.get_tensor("offsets").tolist()
                prompt_lens = f.get_tensor("prompt_lens").tolist()
                self.greedy += [bool(g) for g in f.get_tensor("greedy").tolist()]
                self.tags += f.get_tensor("tags").tolist()
            self.index += [(name, offsets[s], offsets[s + 1], prompt_lens[s]) for s in range(len(prompt_lens))]
        self._open: dict[str, object] = {}

    def __len__(self) -> int:
        return len(self.index)

    def num_tokens(self, ids: Iterable[int] | None = None) -> int:
        ids = range(len(self)) if ids is None else ids
        return sum(self.index[i][2] - self.index[i][1] for i in ids)

    def _file(self, name: str):
        if name not in self._open:
            self._open[name] = safe_open(str(self.folder / name), framework="pt")
        return self._open[name]

    def __getitem__(self, i: int) -> Sample:
        name, start, end, prompt_len = self.index[i]
        f = self._file(name)
        tokens = f.get_slice("tokens")[start:end].long()
        feats = torch.cat([f.get_slice(_hidden_key(layer))[start:end] for layer in self.layers], dim=-1)
        return Sample(tokens, prompt_len, self.greedy[i], feats, f.get_slice("hidden.final")[start:end])

    def token_counts(self, vocab_size: int, ids: Iterable[int] | None = None) -> torch.Tensor:
        """[vocab_size] how often each token occurs in the sequences ``ids`` (default all)."""
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        for i in range(len(self)) if ids is None else ids:
            name, start, end, _ = self.index[i]
            tokens = self._file(name).get_slice("tokens")[start:end].long()
            counts += torch.bincount(tokens, minlength=vocab_size)[:vocab_size]
        return counts


# -- prompts -> chat-formatted requests ----------------------------------------------------------


def chat_ids(tokenizer, text: str) -> list[int]:
    return encode_chat(tokenizer, [{"role": "user", "content": text}])


def write_questions(runner: ModelRunner, tokenizer, requests: list[str], seed: int, batch_size: int) -> list[str]:
    """The target's sampled answers to ``requests`` that ask it to write a question: its own instructions."""
    answers = [""] * len(requests)

    def done(g: Generated) -> None:
        answers[g.tag] = decode(tokenizer, g.token_ids[g.prompt_len :]).strip()

    items = [Request(chat_ids(tokenizer, r), seed + i, i) for i, r in enumerate(requests)]
    generate_batched(runner, items, (), max_new_tokens=48, batch_size=batch_size, on_done=done)
    return answers


def response_seed(index: int, greedy_fraction: float, seed: int) -> int | None:
    """None (greedy) for most prompts, a sampling seed for the rest; fixed per prompt index."""
    rng = random.Random(seed * 1_000_003 + index)
    return None if rng.random() < greedy_fraction else rng.randrange(2**31)


SELF_INSTRUCT_EVERY = 8  # every 8th prompt is a question the target wrote itself


def collect(
    runner: ModelRunner,
    tokenizer,
    folder: Path,
    prompts: Sequence[str],
    layers: Sequence[int],
    *,
    seed: int = 0,
    greedy_fraction: float = 0.75,
    max_new_tokens: int = 256,
    batch_size: int = 12,
    chunk: int = 96,
    meta: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
    self_instruct: Sequence[str] = (),
) -> dict:
    """Generate and cache responses to ``prompts`` not yet in ``folder``; return the manifest.

    Every ``SELF_INSTRUCT_EVERY``-th prompt is replaced by a question the target writes
    from the matching ``self_instruct`` request (when given).
    """
    writer = ShardWriter(folder, layers, meta or {})
    start = writer.manifest["prompts_done"]
    if start >= len(prompts):
        return writer.manifest  # nothing to add (and nothing written: a collector may be running beside)
    for lo in range(start, len(prompts), chunk):
        hi = min(lo + chunk, len(prompts))
        texts = list(prompts[lo:hi])
        own = [i for i in range(lo, hi) if self_instruct and i % SELF_INSTRUCT_EVERY == SELF_INSTRUCT_EVERY - 1]
        if own:
            questions = write_questions(runner, tokenizer, [self_instruct[i % len(self_instruct)] for i in own],
                                        seed * 7919 + lo, batch_size)
            for i, q in zip(own, questions, strict=True):
                if q:
                    texts[i - lo] = q
        requests = [Request(chat_ids(tokenizer, t), response_seed(lo + j, greedy_fraction, seed), lo + j)
                    for j, t in enumerate(texts)]
        generate_batched(runner, requests, layers, max_new_tokens, batch_size, writer.add)
        writer.flush(hi)
        if progress is not None:
            progress(hi, writer.manifest["num_tokens"])
    return writer.manifest
