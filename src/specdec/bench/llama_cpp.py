"""llama.cpp's ``llama-server`` as a bench peer: plain decoding, its n-gram speculation and its draft model.

Rows ``llama.cpp plain``, ``llama.cpp ngram-simple``, ``llama.cpp ngram-map-k`` and
``llama.cpp ngram-mod`` (llama-server's ``--spec-type`` names), and ``llama.cpp draft-simple``
(``--spec-type draft-simple --spec-draft-model FILE``, the bench's --draft-model as a GGUF file)
when a method of the run drafts with a draft model (draft-model, or adaptive with one). Each row runs one
llama-server process per cell (started on 127.0.0.1 on a free port, stopped when the
cell ends, also on error) on the same GGUF file, with the bench's thread count, and
gets the same chat-templated prompt token ids, token budget and sampling settings as
specdec (greedy: temperature 0, top_k 1, seed 0; ``cache_prompt`` off).

Timing is llama.cpp's own: a request's seconds are the server's reported
``prompt_ms + predicted_ms`` (prefill + decode, as specdec's wall time includes its
prefill; HTTP and JSON excluded). Its decode-only speed (``predicted_n / predicted_ms``)
and, for each speculative mode, how many greedy outputs equal llama.cpp plain's on
the same prompt go into one note per row (llama.cpp's speculation is not lossless in
practice: batched and single-token passes round differently).

The binary: ``$SPECDEC_LLAMA_SERVER``, else the newest build under
``${SPECDEC_LLAMA_CPP_DIR:-~/.cache/specdec/llama.cpp}/*/bin/`` (``scripts/build_llama_cpp.sh``
puts it there), else ``llama-server`` on PATH. Without one the rows are skipped with a
notice.

This module implements ``bench.peers.Peer`` without importing it (``peers`` imports
this module and registers ``LlamaServerPeer`` as a virtual subclass).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specdec.bench.config import BenchConfig
from specdec.bench.machine import cpu_info
from specdec.config import SamplingParams, SpecType
from specdec.model.weights import gguf_file
from specdec.stats import SpecStats

MODES = ("plain", "ngram-simple", "ngram-map-k", "ngram-mod")  # the rows every run has
DRAFT_MODE = "draft-simple"  # the row a run with a draft model adds: llama-server's draft model mode
NAME_PREFIX = "llama.cpp "  # row names: "llama.cpp plain", "llama.cpp ngram-simple", ...
GREEDY_SEED = 0
START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 600.0


def cache_root() -> Path:
    return Path(os.environ.get("SPECDEC_LLAMA_CPP_DIR") or Path.home() / ".cache" / "specdec" / "llama.cpp")


def find_llama_server() -> Path | None:
    """$SPECDEC_LLAMA_SERVER, else the newest cached build, else PATH; None when there is none."""
    return find_binary("llama-server", "SPECDEC_LLAMA_SERVER")


def find_binary(name: str, env: str) -> Path | None:
    """A llama.cpp program: ``$env``, else the newest build under ``cache_root()`` (scripts/build_llama_cpp.sh),
    else ``name`` on PATH; None when there is none."""
    override = os.environ.get(env)
    if override:
        path = Path(override)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    builds = [p for p in cache_root().glob(f"*/bin/{name}") if os.access(p, os.X_OK)]
    if builds:
        return max(builds, key=lambda p: _build_number(p.parent.parent.name))
    found = shutil.which(name)
    return Path(found) if found else None


def repack_safe(cpu: dict) -> bool:
    """Whether llama.cpp's repacked weights run on this CPU (``machine.cpu_info()``): on an Intel Xeon with AMX (a
    Sapphire Rapids VM) b11434's repacked weights crashed with a general protection fault for every pass wider than
    one token, so there the peers run without them (llama-server --no-repack, llama-bench --repack 0) and say so."""
    return not (cpu.get("vendor") == "GenuineIntel" and cpu.get("amx"))


REPACK_NOTICE = ("llama.cpp runs without its repacked weights here (--no-repack): on Intel CPUs with AMX they "
                 "crashed for passes wider than one token")


def _build_number(folder: str) -> int:
    digits = folder.lstrip("b").split(".")[0]
    return int(digits) if digits.isdigit() else -1


# -- the server's command line and its replies (pure) ---------------------------------------------


@dataclass(frozen=True)
class ServerSettings:
    """One llama-server process: which binary, model and speculation, and how big."""

    binary: Path
    gguf: Path
    mode: str  # one of MODES
    threads: int
    n_ctx: int
    draft_n_max: int | None = None  # cap on drafted tokens per step (the bench's budget); None: llama.cpp's
    draft_gguf: Path | None = None  # the draft model of DRAFT_MODE
    cache_type: str | None = None  # its KV cache's (-ctk/-ctv: f32, f16, bf16); None: llama.cpp's default, f16
    repack: bool = True  # llama.cpp's repacked weights (off: --no-repack; see repack_safe)
    parallel: int = 1  # slots decoded together (-np; n_ctx is all of theirs: llama-server splits it)

    def __post_init__(self) -> None:
        if self.mode not in (*MODES, DRAFT_MODE):
            raise ValueError(f"unknown llama.cpp mode {self.mode!r}; choose from {', '.join((*MODES, DRAFT_MODE))}")
        if (self.mode == DRAFT_MODE) != (self.draft_gguf is not None):
            raise ValueError(f"llama.cpp {DRAFT_MODE} and only it takes a draft model GGUF file")

    @property
    def name(self) -> str:
        return NAME_PREFIX + self.mode

    def command(self, port: int) -> list[str]:
        """The argv, e.g. [bin, -m, x.gguf, --host, 127.0.0.1, --port, 8080, -t, 2, ..., --spec-type, ngram-mod]."""
        cmd = [str(self.binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(port),
               "-t", str(self.threads), "-tb", str(self.threads), "-c", str(self.n_ctx), "-np", str(self.parallel)]
        if self.cache_type is not None:
            cmd += ["-ctk", self.cache_type, "-ctv", self.cache_type]
        if not self.repack:
            cmd += ["--no-repack"]
        if self.mode == "plain":
            return cmd
        cmd += ["--spec-type", self.mode]
        n = self.draft_n_max
        if self.mode == DRAFT_MODE:
            # The draft runs on the same threads; n-max is the bench's budget (llama.cpp's default is 3).
            cmd += ["--spec-draft-model", str(self.draft_gguf), "--spec-draft-threads", str(self.threads),
                    "--spec-draft-threads-batch", str(self.threads)]
            return cmd + (["--spec-draft-n-max", str(n)] if n is not None else [])
        if n is not None:
            # Draft lengths are per type in llama.cpp: the m-gram size for ngram-simple / ngram-map-k;
            # n-max and n-min for ngram-mod (n-min kept at its default 48/64 share of n-max).
            if self.mode == "ngram-mod":
                cmd += ["--spec-ngram-mod-n-max", str(n), "--spec-ngram-mod-n-min", str(max(1, 3 * n // 4))]
            else:
                cmd += [f"--spec-{self.mode}-size-m", str(n)]
        return cmd


def supported_modes(help_text: str) -> list[str]:
    """The MODES a binary offers, from its ``--help`` (an old build may lack --spec-type or a type)."""
    if "--spec-type" not in help_text:
        return ["plain"]
    return [m for m in MODES if m == "plain" or m in help_text]


def supports_draft_model(help_text: str) -> bool:
    """Whether the binary runs DRAFT_MODE with the flags ``ServerSettings.command`` passes."""
    return all(flag in help_text for flag in (DRAFT_MODE, "--spec-draft-model", "--spec-draft-n-max",
                                              "--spec-draft-threads"))


def draft_gguf(cfg: BenchConfig, notes: list[str]) -> Path | None:
    """The run's draft model as a GGUF file when a method drafts with it; else None (with a notice when
    there is a draft model llama.cpp cannot read)."""
    drafts = any(t in (SpecType.DRAFT_MODEL, SpecType.ADAPTIVE) for m in cfg.methods for t in m.spec.types)
    if not cfg.draft_model or not drafts:
        return None
    path = gguf_file(cfg.draft_model)
    if path is None:
        _notice(notes, f"llama.cpp {DRAFT_MODE} skipped: the draft model {cfg.draft_model} is not a GGUF file.")
    return path


def request_body(prompt_ids: list[int], params: SamplingParams) -> dict:
    """/completion body: the token ids as they are (no BOS added), specdec's sampling settings."""
    body = {
        "prompt": list(prompt_ids), "n_predict": params.max_new_tokens, "cache_prompt": False,
        "return_tokens": True, "stream": False, "ignore_eos": params.ignore_eos,
        "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
        "xtc_probability": 0.0, "typical_p": 1.0, "n_probs": 0,
    }
    if params.greedy:
        body.update(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, seed=GREEDY_SEED)
    else:
        body.update(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                    min_p=params.min_p, seed=params.seed if params.seed is not None else GREEDY_SEED)
    if params.stop:
        body["stop"] = list(params.stop)
    return body


@dataclass(frozen=True)
class Completion:
    """One /completion reply: output token ids and llama.cpp's own timings."""

    token_ids: list[int]
    text: str
    stop_type: str
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0
    draft_n_accepted: int = 0

    @property
    def seconds(self) -> float:
        return (self.prompt_ms + self.predicted_ms) / 1000

    @property
    def decode_tokens_per_s(self) -> float:
        return self.predicted_n / self.predicted_ms * 1000 if self.predicted_ms > 0 else 0.0


def parse_completion(reply: dict) -> Completion:
    """Read a /completion reply; a reply without token ids or timings is an error, not a guess."""
    if "tokens" not in reply or "timings" not in reply:
        raise ValueError(f"llama-server reply has no {'tokens' if 'tokens' not in reply else 'timings'} "
                         f"(keys: {sorted(reply)}); is return_tokens supported by this build?")
    t = reply["timings"]
    return Completion(
        token_ids=[int(x) for x in reply["tokens"]], text=reply.get("content", ""),
        stop_type=str(reply.get("stop_type", "")), prompt_n=int(t["prompt_n"]), prompt_ms=float(t["prompt_ms"]),
        predicted_n=int(t["predicted_n"]), predicted_ms=float(t["predicted_ms"]),
        draft_n=int(t.get("draft_n", 0)), draft_n_accepted=int(t.get("draft_n_accepted", 0)),
    )


def add_completion(stats: SpecStats, prompt_len: int, c: Completion) -> None:
    """Sum one reply into a cell's stats: token counts from token ids, seconds from llama.cpp's timings."""
    stats.new_tokens += len(c.token_ids)
    stats.prompt_tokens += prompt_len
    stats.seconds += c.seconds
    stats.prefill_seconds += c.prompt_ms / 1000
    stats.drafted += c.draft_n
    stats.accepted += c.draft_n_accepted


# -- equality with llama.cpp plain ----------------------------------------------------------------


@dataclass
class Tally:
    """One row's greedy outputs against llama.cpp plain's on the same prompts, and its decode speed."""

    equal: int = 0
    compared: int = 0
    predicted_n: int = 0
    predicted_ms: float = 0.0

    def note(self, name: str) -> str:
        speed = self.predicted_n / self.predicted_ms * 1000 if self.predicted_ms > 0 else 0.0
        text = f"{name}: decode-only {speed:.1f} tok/s (llama-server's predicted_n / predicted_ms)"
        if name != NAME_PREFIX + "plain":
            text += f"; {self.equal} of {self.compared} greedy outputs equal llama.cpp plain's on the same prompt"
        return text + "."


@dataclass
class Family:
    """What the llama.cpp rows share: plain's greedy outputs by prompt, and the run's notes."""

    notes: list[str]
    plain_outputs: dict[tuple[tuple[int, ...], int], list[int]] = field(default_factory=dict)

    def record(self, name: str, tally: Tally, prompt_ids: list[int], params: SamplingParams,
               output: list[int]) -> None:
        """Book one greedy output: plain's is kept; another mode's is compared with it (whole lists)."""
        key = (tuple(prompt_ids), params.max_new_tokens)
        if name == NAME_PREFIX + "plain":
            self.plain_outputs[key] = list(output)
        elif key in self.plain_outputs:
            tally.compared += 1
            tally.equal += output == self.plain_outputs[key]

    def publish(self, name: str, tally: Tally) -> None:
        """Put the row's note into the run's notes, replacing its earlier version."""
        text = tally.note(name)
        head = name + ":"
        for i, old in enumerate(self.notes):
            if old.startswith(head):
                self.notes[i] = text
                return
        self.notes.append(text)


# -- the process ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the bench process dies (Linux), so no server outlives it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class LlamaServer:
    """A running llama-server; use as a context manager (the process is stopped on exit, always)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._logdir: tempfile.TemporaryDirectory | None = None
        self._log = None

    def __enter__(self) -> LlamaServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._logdir = tempfile.TemporaryDirectory(prefix="specdec-llama-server-")
        self._log = open(Path(self._logdir.name) / "server.log", "wb")  # noqa: SIM115 (closed in stop)
        self.port = free_port()
        self.proc = subprocess.Popen(
            self.settings.command(self.port), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with status {self.proc.returncode} while starting: "
                                   f"{' '.join(self.settings.command(self.port))}\n{self.log_tail()}")
            if self._healthy():
                return
            time.sleep(0.1)
        raise RuntimeError(f"llama-server not ready after {START_TIMEOUT_S:.0f} s\n{self.log_tail()}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False  # not listening yet, or 503 while the model loads

    def complete(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        data = json.dumps(request_body(prompt_ids, params)).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                return parse_completion(json.loads(r.read()))
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"llama-server /completion failed ({exc.code}): {exc.read()[:500]!r}") from exc

    def log_tail(self, num_bytes: int = 3000) -> str:
        if self._logdir is None:
            return ""
        path = Path(self._logdir.name) / "server.log"
        return path.read_bytes()[-num_bytes:].decode(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # llama-server shuts down cleanly on SIGINT / SIGTERM
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._logdir is not None:
            self._logdir.cleanup()
            self._logdir = None


# -- the peer -------------------------------------------------------------------------------------


class LlamaServerPeer:
    """One llama.cpp row; the Peer interface of ``bench.peers`` (generate, warmup, run)."""

    def __init__(self, settings: ServerSettings, family: Family) -> None:
        self.settings, self.family = settings, family
        self.name = settings.name
        self.tally = Tally()

    def warmup(self) -> None:
        """Nothing: llama-server warms itself up when it starts, and its timings exclude start-up."""

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        with LlamaServer(self.settings) as server:
            return server.complete(prompt_ids, params).token_ids

    def run(self, prompts: list[list[int]], params: list[SamplingParams],
            tick: Callable[[int], None]) -> tuple[list[list[int]], SpecStats]:
        """One server for the whole cell; outputs as token ids, seconds from llama.cpp's timings."""
        outputs: list[list[int]] = []
        stats = SpecStats()
        with LlamaServer(self.settings) as server:
            for ids, p in zip(prompts, params, strict=True):
                c = server.complete(ids, p)
                add_completion(stats, len(ids), c)
                outputs.append(c.token_ids)
                self.tally.predicted_n += c.predicted_n
                self.tally.predicted_ms += c.predicted_ms
                if p.greedy:
                    self.family.record(self.name, self.tally, ids, p, c.token_ids)
                tick(1)
        self.family.publish(self.name, self.tally)
        return outputs, stats


# --kv-cache-dtype -> llama.cpp's --cache-type-k/-v names
CACHE_TYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def server_peers(cfg: BenchConfig, gguf: Path | None, notes: list[str]) -> list[LlamaServerPeer]:
    """The llama.cpp rows this machine can run, plain first; otherwise one notice saying why not."""
    binary = find_llama_server()
    why = None
    if gguf is None:
        why = "it needs a GGUF model (--model FILE.gguf)"
    elif binary is None:
        why = ("no llama-server binary (build one with `bash scripts/build_llama_cpp.sh`, or set "
               "SPECDEC_LLAMA_SERVER)")
    if why is not None:
        _notice(notes, f"llama-cpp peer (llama.cpp llama-server) skipped: {why}.")
        return []
    try:
        help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        _notice(notes, f"llama-cpp peer (llama.cpp llama-server) skipped: {binary} --help failed: {exc}.")
        return []
    modes = supported_modes(help_text)
    if len(modes) < len(MODES):
        _notice(notes, f"{binary} lacks llama.cpp modes {', '.join(m for m in MODES if m not in modes)}.")
    family = Family(notes)
    threads = cfg.peer_threads or os.cpu_count() or 1
    cache_type = CACHE_TYPES.get(cfg.kv_cache_dtype)  # specdec's own, where --kv-cache-dtype named one
    repack = repack_safe(cpu_info())
    if not repack:
        _notice(notes, REPACK_NOTICE + ".")
    rows = [LlamaServerPeer(ServerSettings(binary, gguf, m, threads, cfg.max_model_len, cfg.draft_n_max,
                                           cache_type=cache_type, repack=repack), family)
            for m in modes]
    draft = draft_gguf(cfg, notes)
    if draft is not None and not supports_draft_model(help_text):
        _notice(notes, f"llama.cpp {DRAFT_MODE} skipped: {binary} lacks --spec-type {DRAFT_MODE} / "
                       "--spec-draft-model.")
    elif draft is not None:
        settings = ServerSettings(binary, gguf, DRAFT_MODE, threads, cfg.max_model_len, cfg.draft_n_max, draft,
                                  cache_type=cache_type, repack=repack)
        rows.append(LlamaServerPeer(settings, family))
    return rows


def _notice(notes: list[str], text: str) -> None:
    notes.append(text)
    print(f"[specdec bench] {text}", file=sys.stderr)

