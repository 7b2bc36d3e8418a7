"""bench.llama_cpp: llama-server's command line, its replies, the equality bookkeeping, the process
lifecycle (against a stand-in server script), and one real run of the built binary (slow)."""

from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from specdec.bench import llama_bench, llama_cpp, peers, report
from specdec.bench.config import BenchConfig, parse_methods
from specdec.bench.llama_cpp import (
    Family,
    LlamaServer,
    LlamaServerPeer,
    ServerSettings,
    Tally,
    add_completion,
    parse_completion,
    request_body,
    server_peers,
    supported_modes,
)
from specdec.config import SamplingParams, SpecConfig
from specdec.errors import UsageError
from specdec.stats import SpecStats

REPLY = {
    "content": " Hello",
    "tokens": [19556, 2],
    "stop_type": "eos",
    "timings": {"cache_n": 0, "prompt_n": 12, "prompt_ms": 30.5, "prompt_per_token_ms": 2.5,
                "prompt_per_second": 393.4, "predicted_n": 2, "predicted_ms": 20.0,
                "predicted_per_token_ms": 10.0, "predicted_per_second": 100.0,
                "draft_n": 8, "draft_n_accepted": 5},
}


def settings(mode: str = "plain", draft_n_max: int | None = 8, binary: str = "/opt/llama-server") -> ServerSettings:
    return ServerSettings(Path(binary), Path("/m/model.gguf"), mode, threads=2, n_ctx=4096, draft_n_max=draft_n_max)


def bench_config(**kw) -> BenchConfig:
    return BenchConfig(methods=parse_methods("none", SpecConfig()), workloads=[], **kw)


# -- command line ----------------------------------------------------------------------------------


def test_plain_command():
    assert settings().command(8123) == [
        "/opt/llama-server", "-m", "/m/model.gguf", "--host", "127.0.0.1", "--port", "8123",
        "-t", "2", "-tb", "2", "-c", "4096", "-np", "1"]
    assert settings().name == "llama.cpp plain"


def test_parallel_slots_share_the_context():
    # scripts/serve_concurrency.py's peer: -np slots, -c all of theirs (llama-server splits it among them)
    s = ServerSettings(Path("/opt/llama-server"), Path("/m/model.gguf"), "plain", threads=2, n_ctx=8192, parallel=4)
    assert s.command(1)[-4:] == ["-c", "8192", "-np", "4"]


@pytest.mark.parametrize(("mode", "tail"), [
    ("ngram-simple", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "8"]),
    ("ngram-map-k", ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-m", "8"]),
    ("ngram-mod", ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "8", "--spec-ngram-mod-n-min", "6"]),
])
def test_speculative_commands_cap_drafts_at_the_bench_budget(mode, tail):
    cmd = settings(mode).command(1)
    assert cmd[-len(tail):] == tail
    assert settings(mode).name == f"llama.cpp {mode}"
    # without a budget, llama.cpp's own draft lengths
    assert settings(mode, draft_n_max=None).command(1)[-2:] == ["--spec-type", mode]


def test_the_peer_keeps_its_kv_cache_type_unless_the_bench_names_one():
    """llama-server's default cache is f16; `bench --kv-cache-dtype X` runs both sides in X (-ctk/-ctv)."""
    assert "-ctk" not in settings().command(1)
    row = ServerSettings(Path("/b"), Path("/m.gguf"), "ngram-mod", 2, 512, draft_n_max=4, cache_type="f16")
    assert row.command(1)[15:19] == ["-ctk", "f16", "-ctv", "f16"]
    assert [llama_cpp.CACHE_TYPES.get(kv) for kv in ("auto", "float32", "float16", "bfloat16")] == [
        None, "f32", "f16", "bf16"]


def test_the_report_names_both_kv_cache_types():
    from specdec.bench.cli import run_notes

    meta = {"machine": {"amx": False, "avx512_bf16": False}, "device": "cpu", "kv_cache": "float32"}
    kv = [n for n in run_notes(bench_config(peers=["llama-cpp"]), meta) if n.startswith("KV cache")]
    assert kv == ["KV cache: specdec float32, llama-server f16 (its default; --kv-cache-dtype float16 runs both "
                  "alike)."]
    kv = [n for n in run_notes(bench_config(peers=["llama-cpp"], kv_cache_dtype="float16"), meta)
          if n.startswith("KV cache")]
    assert kv == ["KV cache: specdec float16, llama-server float16 too (-ctk/-ctv, as --kv-cache-dtype asked)."]
    assert not [n for n in run_notes(bench_config(peers=[]), meta) if n.startswith("KV cache")]


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="unknown llama.cpp mode"):
        settings("ngram-cache")


def test_draft_simple_command_passes_the_draft_file_and_budget():
    row = ServerSettings(Path("/opt/llama-server"), Path("/m/model.gguf"), "draft-simple", threads=2, n_ctx=4096,
                         draft_n_max=8, draft_gguf=Path("/m/draft.gguf"))
    assert row.name == "llama.cpp draft-simple"
    assert row.command(1)[-12:] == ["-np", "1", "--spec-type", "draft-simple", "--spec-draft-model", "/m/draft.gguf",
                                    "--spec-draft-threads", "2", "--spec-draft-threads-batch", "2",
                                    "--spec-draft-n-max", "8"]
    with pytest.raises(ValueError, match="only it takes a draft model"):
        settings("draft-simple")
    with pytest.raises(ValueError, match="only it takes a draft model"):
        ServerSettings(Path("/b"), Path("/m.gguf"), "plain", 2, 512, draft_gguf=Path("/m/draft.gguf"))


def test_supported_modes_from_help():
    assert supported_modes("-m FNAME\n--port N\n") == ["plain"]
    full = "--spec-type [none|ngram-cache|ngram-simple|ngram-map-k|ngram-map-k4v|ngram-mod]"
    assert supported_modes(full) == list(llama_cpp.MODES)
    assert supported_modes("--spec-type [none|ngram-simple]") == ["plain", "ngram-simple"]


# -- requests and replies --------------------------------------------------------------------------


def test_greedy_request_body():
    body = request_body([1, 2, 3], SamplingParams(max_new_tokens=16))
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 16
    assert body["temperature"] == 0.0 and body["top_k"] == 1 and body["seed"] == 0
    assert body["cache_prompt"] is False and body["return_tokens"] is True and body["stream"] is False
    assert body["repeat_penalty"] == 1.0 and body["dry_multiplier"] == 0.0
    assert "stop" not in body


def test_sampled_request_body():
    body = request_body([5], SamplingParams(max_new_tokens=4, temperature=0.7, top_p=0.9, seed=11, stop=("\n",)))
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"], body["seed"]) == (0.7, 0, 0.9, 0.0, 11)
    assert body["stop"] == ["\n"]


def test_parse_completion_reads_tokens_and_timings():
    c = parse_completion(REPLY)
    assert c.token_ids == [19556, 2] and c.text == " Hello" and c.stop_type == "eos"
    assert (c.prompt_n, c.prompt_ms, c.predicted_n, c.predicted_ms) == (12, 30.5, 2, 20.0)
    assert (c.draft_n, c.draft_n_accepted) == (8, 5)
    assert c.seconds == pytest.approx(0.0505)
    assert c.decode_tokens_per_s == pytest.approx(100.0)
    plain = dict(REPLY, timings={k: v for k, v in REPLY["timings"].items() if not k.startswith("draft")})
    assert parse_completion(plain).draft_n == 0  # llama-server omits draft counts without drafts


def test_parse_completion_without_tokens_fails_loudly():
    with pytest.raises(ValueError, match="no tokens"):
        parse_completion({k: v for k, v in REPLY.items() if k != "tokens"})
    with pytest.raises(ValueError, match="no timings"):
        parse_completion({k: v for k, v in REPLY.items() if k != "timings"})


def test_stats_count_token_ids_and_llama_cpp_seconds():
    stats = SpecStats()
    add_completion(stats, 12, parse_completion(REPLY))
    add_completion(stats, 3, parse_completion(REPLY))
    assert (stats.new_tokens, stats.prompt_tokens, stats.drafted, stats.accepted) == (4, 15, 16, 10)
    assert stats.seconds == pytest.approx(0.101) and stats.prefill_seconds == pytest.approx(0.061)


# -- equality with llama.cpp plain -----------------------------------------------------------------


def test_family_compares_whole_outputs_with_plain():
    notes = ["something else"]
    family = Family(notes)
    plain, spec = Tally(), Tally()
    p = SamplingParams(max_new_tokens=4)
    family.record("llama.cpp plain", plain, [1, 2], p, [7, 8, 9])
    family.record("llama.cpp plain", plain, [3], p, [4, 5])
    family.record("llama.cpp ngram-mod", spec, [1, 2], p, [7, 8, 9])
    family.record("llama.cpp ngram-mod", spec, [3], p, [4])  # a prefix is not equal: whole lists
    family.record("llama.cpp ngram-mod", spec, [9, 9], p, [1])  # no plain output for it: not compared
    family.record("llama.cpp ngram-mod", spec, [1, 2], SamplingParams(max_new_tokens=8), [7])  # other budget
    assert (spec.equal, spec.compared) == (1, 2)
    spec.predicted_n, spec.predicted_ms = 30, 500.0
    family.publish("llama.cpp ngram-mod", spec)
    assert notes[1] == ("llama.cpp ngram-mod: decode-only 60.0 tok/s (llama-server's predicted_n / predicted_ms); "
                        "1 of 2 greedy outputs equal llama.cpp plain's on the same prompt.")
    spec.equal, spec.compared = 3, 4
    family.publish("llama.cpp ngram-mod", spec)  # replaces its line, keeps the others
    family.publish("llama.cpp plain", plain)
    assert len(notes) == 3 and "3 of 4" in notes[1] and notes[0] == "something else"
    assert notes[2].startswith("llama.cpp plain: decode-only") and "equal" not in notes[2]


def test_report_moves_llama_cpp_notes_into_correctness():
    notes = ["llama.cpp ngram-mod: decode-only 60.0 tok/s; 1 of 2 greedy outputs equal", "other note"]
    lines = report.llama_cpp_lines(notes)
    assert "reported timings" in lines[0] and lines[1] == "  - " + notes[0]
    assert report.llama_cpp_lines(["other note"]) == []


# -- finding the binary, and skipping without one ----------------------------------------------------


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_find_llama_server(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("SPECDEC_LLAMA_CPP_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert llama_cpp.find_llama_server() is None
    _executable(tmp_path / "cache" / "b9000" / "bin" / "llama-server")
    newest = _executable(tmp_path / "cache" / "b11434" / "bin" / "llama-server")
    assert llama_cpp.find_llama_server() == newest
    override = _executable(tmp_path / "elsewhere" / "llama-server")
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(override))
    assert llama_cpp.find_llama_server() == override
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(tmp_path / "missing"))
    assert llama_cpp.find_llama_server() is None


def test_no_binary_or_no_gguf_skips_with_one_notice(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(tmp_path / "missing"))
    notes: list[str] = []
    assert server_peers(bench_config(), Path("/m/model.gguf"), notes) == []
    assert len(notes) == 1 and "skipped: no llama-server binary" in notes[0] and "build_llama_cpp.sh" in notes[0]
    assert capsys.readouterr().err.count("skipped") == 1
    notes.clear()
    assert server_peers(bench_config(), None, notes) == []
    assert len(notes) == 1 and "needs a GGUF model" in notes[0]


# -- the process, against a stand-in llama-server ---------------------------------------------------

FAKE_SERVER = """\
#!{python}
# Stands in for llama-server: /health, and /completion echoing a fixed reply.
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

argv = sys.argv[1:]
if "--help" in argv:
    print(os.environ.get("FAKE_LLAMA_HELP", "--spec-type [none|ngram-simple|ngram-map-k|ngram-mod]"))
    sys.exit(0)
if os.environ.get("FAKE_LLAMA_FAIL"):
    print("error: failed to load model", flush=True)
    sys.exit(1)
port = int(argv[argv.index("--port") + 1])
spec = "--spec-type" in argv
with open(os.environ["FAKE_LLAMA_PIDS"], "a") as f:
    f.write(f"{{os.getpid()}}\\n")

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({{"status": "ok"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["cache_prompt"] is False and body["return_tokens"] is True
        n = body["n_predict"]
        tokens = [(t * 7 + len(body["prompt"])) % 50 for t in range(n)]
        if spec and body["prompt"][0] == 1:
            tokens[-1] += 1  # speculation changes this prompt's output
        timings = {{"prompt_n": len(body["prompt"]), "prompt_ms": 10.0, "predicted_n": n, "predicted_ms": 40.0}}
        if spec:
            timings.update(draft_n=4, draft_n_accepted=3)
        self._send({{"content": "x", "tokens": tokens, "stop_type": "limit", "timings": timings}})

HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
def fake_server(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "llama-server"
    path.write_text(FAKE_SERVER.format(python=sys.executable))
    path.chmod(0o755)
    monkeypatch.setenv("FAKE_LLAMA_PIDS", str(tmp_path / "pids"))
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(path))
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def _pids(tmp_path: Path) -> list[int]:
    return [int(x) for x in (tmp_path / "pids").read_text().split()]


DRAFT_HELP = "--spec-type none,draft-simple,ngram-simple,ngram-map-k,ngram-mod\n--spec-draft-model FNAME\n" \
             "--spec-draft-n-max N\n--spec-draft-threads N\n"


def draft_config(tmp_path: Path, methods: str, draft: str | None = None) -> BenchConfig:
    if draft is None:
        draft = str(tmp_path / "draft.gguf")
        Path(draft).touch()
    base = SpecConfig(draft_model=draft)
    return BenchConfig(methods=parse_methods(methods, base), workloads=[], draft_model=draft)


def test_a_draft_model_method_adds_llama_cpp_draft_simple(fake_server, tmp_path, monkeypatch):
    """With a draft-model (or adaptive) method and a GGUF draft: one more row, on the same draft file;
    without such a method, or with a draft llama.cpp cannot read or a binary without the mode: none."""
    monkeypatch.setenv("FAKE_LLAMA_HELP", DRAFT_HELP)
    for methods in ("none,draft-model", "adaptive"):
        notes: list[str] = []
        rows = server_peers(draft_config(tmp_path, methods), Path("/m/model.gguf"), notes)
        assert [r.name for r in rows][-1] == "llama.cpp draft-simple" and len(rows) == 5 and notes == []
        assert rows[-1].settings.draft_gguf == tmp_path / "draft.gguf"
    notes = []
    assert len(server_peers(draft_config(tmp_path, "none,ngram"), Path("/m/model.gguf"), notes)) == 4
    assert notes == []
    folder = tmp_path / "hf-draft"
    folder.mkdir()
    assert len(server_peers(draft_config(tmp_path, "none,draft-model", str(folder)), Path("/m/model.gguf"),
                            notes)) == 4
    assert len(notes) == 1 and "draft-simple skipped" in notes[0] and "not a GGUF file" in notes[0]
    monkeypatch.delenv("FAKE_LLAMA_HELP")
    notes = []
    rows = server_peers(draft_config(tmp_path, "none,draft-model"), Path("/m/model.gguf"), notes)
    assert "llama.cpp draft-simple" not in [r.name for r in rows]
    assert len(notes) == 1 and "lacks --spec-type draft-simple" in notes[0]


@pytest.mark.slow  # starts and stops a server per mode: 76 s
def test_peers_run_on_a_server_each_and_stop_it(fake_server, tmp_path):
    notes: list[str] = []
    rows = server_peers(bench_config(max_model_len=512, draft_n_max=4), Path("/m/model.gguf"), notes)
    assert [r.name for r in rows] == [f"llama.cpp {m}" for m in llama_cpp.MODES] and notes == []
    assert all(isinstance(r, LlamaServerPeer) and isinstance(r, peers.Peer) for r in rows)  # virtual subclass
    prompts, params = [[1, 2, 3], [4, 5]], [SamplingParams(max_new_tokens=5)] * 2
    ticks: list[int] = []
    outputs = {}
    for row in rows:
        outputs[row.name], stats = row.run(prompts, params, ticks.append)
        assert stats.new_tokens == 10 and stats.prompt_tokens == 5
        assert stats.seconds == pytest.approx(0.1)  # llama.cpp's 10 + 40 ms per request, not our clock
    assert len(ticks) == 8 and len(_pids(tmp_path)) == 4
    assert not any(_alive(pid) for pid in _pids(tmp_path))
    assert outputs["llama.cpp plain"][1] == outputs["llama.cpp ngram-mod"][1]
    assert stats.drafted == 8 and stats.accepted == 6
    by_row = {n.split(":")[0]: n for n in notes}
    assert set(by_row) == {r.name for r in rows}
    assert "1 of 2 greedy outputs equal" in by_row["llama.cpp ngram-simple"]
    assert "decode-only 125.0 tok/s" in by_row["llama.cpp plain"]
    assert rows[0].generate([4, 5], SamplingParams(max_new_tokens=2)) == outputs["llama.cpp plain"][1][:2]


def test_server_is_stopped_on_error(fake_server, tmp_path):
    row = server_peers(bench_config(), Path("/m/model.gguf"), [])[0]
    with pytest.raises(RuntimeError, match="boom"), LlamaServer(row.settings) as server:
        assert server.complete([1], SamplingParams(max_new_tokens=1)).token_ids == [1]
        raise RuntimeError("boom")
    assert not _alive(_pids(tmp_path)[0])


def test_a_server_that_dies_at_start_shows_its_log(fake_server, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_FAIL", "1")
    row = server_peers(bench_config(), Path("/m/model.gguf"), [])[0]
    with pytest.raises(RuntimeError, match="failed to load model"):
        row.run([[1]], [SamplingParams(max_new_tokens=1)], lambda n: None)


# -- llama-bench beside `specdec bench passes --llama-bench` ---------------------------------------------


def test_llama_bench_command_and_report():
    cmd = llama_bench.command(Path("/b/llama-bench"), Path("/m/x.gguf"), 2, [1, 8], 300, 9)
    assert cmd == ["/b/llama-bench", "-m", "/m/x.gguf", "-t", "2", "-p", "1,8", "-n", "0", "-d", "300", "-r", "9",
                   "-o", "json"]
    assert llama_bench.command(Path("b"), Path("x.gguf"), 2, [1], 0, 1, repack=False)[-2:] == ["--repack", "0"]
    report = [{"n_prompt": 1, "n_gen": 0, "n_depth": 300, "avg_ns": 9965256, "build_number": 11434},
              {"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ns": 4_750_000_000},
              {"n_prompt": 0, "n_gen": 16, "n_depth": 0, "avg_ns": 485_000_000}]  # a tgN test: not a pass
    assert llama_bench.batch_ms(report) == {(1, 300): pytest.approx(9.965256), (512, 0): pytest.approx(4750.0)}


def test_llama_cpp_runs_without_repacked_weights_on_intel_cpus_with_amx():
    """b11434's repacked weights crashed on a Sapphire Rapids VM for every pass wider than one token."""
    spr = {"vendor": "GenuineIntel", "amx": True}
    assert not llama_cpp.repack_safe(spr)
    assert llama_cpp.repack_safe({"vendor": "GenuineIntel", "amx": False}) and llama_cpp.repack_safe(
        {"vendor": "AuthenticAMD", "amx": False})
    plain = ServerSettings(Path("/b/llama-server"), Path("/m/x.gguf"), "plain", 2, 4096)
    assert "--no-repack" not in plain.command(8080)
    assert replace(plain, repack=False).command(8080)[-1] == "--no-repack"


def test_a_failing_llama_bench_is_one_line(tmp_path):
    fake = tmp_path / "llama-bench"
    fake.write_text("#!/bin/sh\necho 'loading model' >&2\necho 'error: failed to load model' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(UsageError, match="exit code 1 .*error: failed to load model"):
        llama_bench.run(fake, tmp_path / "x.gguf", 2, [1], 300, None, 1)
    fake.write_text("#!/bin/sh\necho '[]'\n")  # ran, reported nothing
    with pytest.raises(UsageError, match="llama-bench failed"):
        llama_bench.run(fake, tmp_path / "x.gguf", 2, [1], 300, None, 1)


def test_bench_passes_llama_bench_needs_a_gguf_and_the_binary(tiny_llama, tmp_path, monkeypatch, capsys):
    from specdec.cli.main import main

    assert main(["bench", "passes", "--model", str(tiny_llama), "--llama-bench"]) == 2
    assert "needs a GGUF model" in capsys.readouterr().err
    monkeypatch.setenv("SPECDEC_LLAMA_BENCH", str(tmp_path / "missing"))
    assert llama_bench.find_llama_bench() is None
    assert main(["bench", "passes", "--llama-bench"]) == 2  # the default model is a GGUF
    err = capsys.readouterr().err
    assert "no llama-bench binary" in err and "build_llama_cpp.sh" in err and len(err.strip().splitlines()) == 1


def test_bench_passes_prints_llama_bench_beside_its_own(tmp_path, monkeypatch, capsys):
    """`bench passes --llama-bench` on the default model's GGUF with a stand-in llama-bench: its ppN after the same
    context beside each width, its prefill beside ours, in the table and in --json."""
    import json

    from specdec.cli.main import main

    tests = [(1, 40, 9e6), (2, 40, 12e6), (64, 0, 160e6)]
    report = json.dumps([{"n_prompt": n, "n_gen": 0, "n_depth": d, "avg_ns": ns, "build_number": 11434}
                         for n, d, ns in tests])
    fake = tmp_path / "llama-bench"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'args'}\ncat <<'EOF'\n{report}\nEOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SPECDEC_LLAMA_BENCH", str(fake))
    argv = ["bench", "passes", "--context", "40", "--widths", "1,2", "--rounds", "2", "--prefill", "64",
            "--llama-bench"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["llama_bench"]["pass_ms"] == {"1": 9.0, "2": 12.0} and out["llama_bench"]["prefill_ms"] == 160.0
    calls = (tmp_path / "args").read_text().splitlines()
    assert [c.split(" -p ")[1].split()[0] for c in calls] == ["1,2", "64"] and " -d 40 " in calls[0]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "llama.cpp b11434's llama-bench" in table and "| 2 |" in table and "(pp64)" in table


# -- the real binary (slow) ----------------------------------------------------------------------------


@pytest.mark.slow
def test_real_llama_bench_on_the_default_model():
    from specdec.bench.machine import cpu_info
    from specdec.model.weights import default_model_path

    binary = llama_bench.find_llama_bench()
    if binary is None:
        pytest.skip("no llama-bench binary: run `bash scripts/build_llama_cpp.sh` (about 5-15 min on 2 cores)")
    peer = llama_bench.run(binary, default_model_path(), 2, [1, 4], 32, 64, 1)
    assert peer["build"] > 0 and set(peer["pass_ms"]) == {1, 4}
    assert all(ms > 0 for ms in peer["pass_ms"].values()) and peer["prefill_ms"] > 0
    assert peer["repack"] == llama_cpp.repack_safe(cpu_info())


@pytest.mark.slow
def test_real_llama_server_on_the_default_model(default_model_folder, capsys):
    from transformers import AutoTokenizer

    from specdec.model.weights import default_model_path

    if llama_cpp.find_llama_server() is None:
        pytest.skip("no llama-server binary: run `bash scripts/build_llama_cpp.sh` (about 15+ min on 2 cores)")
    tok = AutoTokenizer.from_pretrained(default_model_folder)
    chats = ["Rename x to y: def f(x): return x + 1", "What is the capital of France?"]
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                            add_generation_prompt=True), add_special_tokens=False).input_ids
               for c in chats]
    notes: list[str] = []
    rows = server_peers(bench_config(max_model_len=1024), default_model_path(), notes)
    assert [r.name for r in rows] == [f"llama.cpp {m}" for m in llama_cpp.MODES], notes
    params = [SamplingParams(max_new_tokens=16)] * 2
    for row in rows:
        outputs, stats = row.run(prompts, params, lambda n: None)
        assert all(1 <= len(o) <= 16 for o in outputs)
        assert stats.new_tokens == sum(map(len, outputs)) and 0 < stats.prefill_seconds < stats.seconds
        if row.name == "llama.cpp plain":
            # No text check: on this prompt the model's first token is a near tie ("The" -1.88,
            # "L" -1.97 in float32), which llama.cpp's int8 activations may flip.
            plain = outputs
            assert tok.decode(outputs[1], skip_special_tokens=True).strip()
    assert plain[0] != plain[1]
    assert all(r.tally.compared == 2 for r in rows[1:])
    short = tok(tok.apply_chat_template([{"role": "user", "content": "Reply with one word: yes or no?"}],
                                        tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    with LlamaServer(rows[0].settings) as server:  # the EOS token is in the output, as specdec's is
        c = server.complete(short.input_ids, SamplingParams(max_new_tokens=16))
    assert c.stop_type == "eos" and c.token_ids[-1] == tok.eos_token_id and len(c.token_ids) == c.predicted_n
    with capsys.disabled():  # the measured notes, for the record
        print("\n" + textwrap.indent("\n".join(notes), "  "))


@pytest.mark.slow
def test_real_llama_server_draft_simple_on_the_default_model(default_model_folder):
    """llama-server's draft mode with the default model's GGUF drafting for itself: it drafts and accepts."""
    from transformers import AutoTokenizer

    from specdec.model.weights import default_model_path

    if llama_cpp.find_llama_server() is None:
        pytest.skip("no llama-server binary: run `bash scripts/build_llama_cpp.sh` (about 15+ min on 2 cores)")
    gguf = default_model_path()
    cfg = BenchConfig(methods=parse_methods("none,draft-model", SpecConfig(draft_model=str(gguf))), workloads=[],
                      draft_model=str(gguf), max_model_len=1024, draft_n_max=4)
    notes: list[str] = []
    row = server_peers(cfg, gguf, notes)[-1]
    assert row.name == "llama.cpp draft-simple", notes
    tok = AutoTokenizer.from_pretrained(default_model_folder)
    prompt = tok(tok.apply_chat_template([{"role": "user", "content": "Count from 1 to 20."}], tokenize=False,
                                         add_generation_prompt=True), add_special_tokens=False).input_ids
    outputs, stats = row.run([prompt], [SamplingParams(max_new_tokens=24)], lambda n: None)
    assert 1 <= len(outputs[0]) <= 24 and stats.drafted > 0 and stats.accepted > 0, (stats.drafted, notes)
