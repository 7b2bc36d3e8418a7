"""`specdec train mtp`: an MTP module trained for a target that ships none, loaded by draft-mtp.

The target is the peaked bigram model (its greedy next token depends on the last token
only), so a few training steps on its own continuations of the prompts teach the module
drafts the verifier accepts. The module's sampled chains keep the target's distribution
in test_lossless_sampling.py (the MTP section: the drafter is the same for every module).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.heads import load_mtp_head
from specdec.drafters.registry import DraftResources
from specdec.errors import ModelLoadError
from specdec.llm import LLM
from specdec.server.cli import spec_from_vllm_config
from specdec.train.data import SampleStore
from specdec.train.mtp import checkpoint_names

PROMPTS = ["Count to ten", "Name three colours", "Say hi", "Write a haiku about rain", "List four fruits",
           "Tell me a joke"]
STEPS = 20


def specdec(capsys, *args: str) -> tuple[int, str]:
    from specdec.cli.main import main

    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def peaked_folder(tiny_model_factory) -> str:
    return str(tiny_model_factory("qwen2", seed=3, logit_scale=4.0, bigram=True))


@pytest.fixture(scope="module")
def trained(peaked_folder, tmp_path_factory) -> tuple:
    """(out folder, the CLI arguments): `specdec train mtp` for STEPS steps on the prompts."""
    out = tmp_path_factory.mktemp("mtp-train")
    prompts = out / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    args = ["train", "mtp", "--target", peaked_folder, "--out", str(out / "m"), "--data", str(prompts),
            "--samples", str(len(PROMPTS)), "--max-new-tokens", "16", "--batch-size", "3", "--threads", "1",
            "--lr", "2e-2", "--batch-tokens", "512", "--greedy-fraction", "0.5", "--ttt-steps", "2",
            "--precision", "fp32"]
    from specdec.cli.main import main

    assert main([*args, "--steps", str(STEPS), "--eval-every", str(STEPS)]) == 0
    return out / "m", args


@pytest.fixture(scope="module")
def peaked(peaked_folder) -> LLM:
    return LLM(peaked_folder, spec="none", max_model_len=256)


def test_checkpoint_is_the_deepseek_layout_draft_mtp_reads(trained, peaked):
    out, _ = trained
    config = json.loads((out / "config.json").read_text())
    L = peaked.runner.config.num_layers
    assert config["num_nextn_predict_layers"] == 1 and config["num_hidden_layers"] == L
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert names == set(checkpoint_names(peaked.runner.config).values())
    assert f"model.layers.{L}.eh_proj.weight" in names and f"model.layers.{L}.self_attn.q_proj.bias" in names
    assert not any("shared_head.head" in n for n in names)  # the target's LM head is the head
    head = load_mtp_head(str(out), peaked.runner)
    assert head.config.layout == "deepseek" and torch.equal(head.lm_head, peaked.runner.output_rows(
        torch.arange(peaked.runner.vocab_size)).float())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == STEPS and records[-1]["tau"] > 1.0  # the validation chain is accepted


def test_greedy_identity_with_the_trained_module(trained, peaked):
    out, _ = trained
    spec = SpecConfig(types=(SpecType.DRAFT_MTP,), spec_model=str(out), draft_n_max=3)
    llm = LLM(peaked.model_name, spec=spec, max_model_len=256, plan_drafts=False)
    params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
    prompts = [peaked.chat_prompt([{"role": "user", "content": p}]) for p in PROMPTS[:4]]  # as trained
    got, want = llm.generate(prompts, params), peaked.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    drafted, accepted = sum(o.stats.drafted for o in got), sum(o.stats.accepted for o in got)
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    spec_json, _ = spec_from_vllm_config(json.dumps({"method": "mtp", "model": str(out),
                                                     "num_speculative_tokens": 2}))
    assert spec_json.types == (SpecType.DRAFT_MTP,) and spec_json.spec_model == str(out)


def test_resume_continues_and_the_data_serves_eagle3(trained, tmp_path, capsys):
    out, args = trained
    rc, err = specdec(capsys, *args, "--resume", "--steps", str(STEPS + 2), "--eval-every", "2")
    assert rc == 0, err
    assert json.loads((out / "state" / "progress.json").read_text())["step"] == STEPS + 2
    # the MTP run's collection (cached with the eagle3 default layers) trains an eagle3 head as it is
    eagle = [a if a != "mtp" else "eagle3" for a in args[:4]] + ["--out", str(tmp_path / "e"), "--data-dir",
                                                                 str(out / "data"), *args[6:]]
    rc, err = specdec(capsys, *eagle, "--steps", "1", "--draft-vocab", "64")
    assert rc == 0, err
    assert not (tmp_path / "e" / "data").exists() and len(SampleStore(out / "data")) == len(PROMPTS)


def test_a_module_for_another_target_is_one_clear_error(trained, tiny_llama, capsys):
    out, _ = trained
    rc, err = specdec(capsys, "generate", "hi", "--model", str(tiny_llama), "--spec-type", "draft-mtp",
                      "--spec-model", str(out), "--max-new-tokens", "2")
    assert rc == 2 and err.strip().count("\n") == 0 and "made for a target with" in err, err
    tiny = LLM(str(tiny_llama), spec="none", max_model_len=64)
    with pytest.raises(ModelLoadError, match="made for a target"):
        DraftResources(SpecConfig(types=(SpecType.DRAFT_MTP,), spec_model=str(out)), tiny.runner, tiny.tokenizer)
