"""P-EAGLE parallel drafting: a head's K drafts from mask entries in one pass, its checkpoints,
`specdec train eagle3 --parallel K`, and --spec-parallel-drafting on the CLI and vLLM's config.

A parallel head's K outputs are pinned against the head's layer written out in plain torch
(and against the training unroll, so training and drafting compute the same thing). Greedy
output is identical to plain decoding with drafts accepted, with a head trained for a few
steps on the peaked bigram model (whose greedy chains a head learns quickly). The
sampling-distribution tests and their broken-verifier check are in test_lossless_sampling.py.
"""

from __future__ import annotations

import json
import math
import random
import shutil

import pytest
import torch
import torch.nn.functional as F

from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.registry import DraftResources
from specdec.engine import Engine
from specdec.errors import ModelLoadError
from specdec.llm import LLM
from specdec.model.eagle_checkpoint import load_head, save_head
from specdec.model.eagle_head import EagleHead, EagleHeadConfig
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner
from specdec.server.cli import spec_from_vllm_config
from specdec.train import data as train_data
from specdec.train.data import Sample
from specdec.train.trainer import Tables, TrainConfig, Trainer
from specdec.train.ttt import make_batch, unroll
from specdec.train.vocab import choose_vocab
from tests.test_eagle3 import tiny_head
from tests.test_lossless import greedy, run

K = 3


def parallel_head(llm: LLM, k: int = K, vocab: torch.Tensor | None = None, scale: float = 0.3,
                  seed: int = 0) -> EagleHead:
    """A random P-EAGLE head for ``llm``'s target drafting ``k`` tokens per pass."""
    return tiny_head(llm, vocab, seed, scale, parallel_tokens=k)


@pytest.fixture(scope="module")
def tiny(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), max_model_len=512)


def target_features(llm: LLM, head: EagleHead, tokens: list[int]) -> torch.Tensor:
    """[len(tokens), F] the target's states of ``tokens`` at the head's layers, concatenated."""
    layers = sorted(set(head.config.feature_layers))
    slot = llm.runner.allocate()
    hidden = llm.runner.run([SeqInput(slot, tokens)], layers).hidden[0]
    llm.runner.free(slot)
    by_layer = dict(zip(layers, hidden, strict=True))
    return torch.cat([by_layer[i] for i in head.config.feature_layers], dim=-1).float()


def reference_logits(head: EagleHead, features: torch.Tensor, ids: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """The head's one layer over m real entries (features g_0..g_{m-1}, tokens x_1..x_m at positions
    1..m) and K - 1 mask entries after them, causal attention, written out: logits [K, Vd] of the
    root (entry m) and the mask entries."""
    c = head.config
    assert c.rope_scaling is None and not c.norm_before_residual
    w = {name: p.detach().float() for name, p in head.named_parameters()}
    m, n, D = len(ids), len(ids) + c.parallel_tokens - 1, c.head_dim

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * weight

    mask_hidden = w["fc.weight"] @ w["mask_hidden"]
    hidden = torch.cat([features @ w["fc.weight"].T, mask_hidden.expand(n - m, -1)])
    embeds = torch.cat([embed[ids], w["mask_embed"].expand(n - m, -1)])
    x = torch.cat([rms(embeds, w["input_layernorm"]), rms(hidden, w["hidden_norm"])], dim=-1)
    q = (x @ w["q_proj.weight"].T).view(n, c.num_heads, D)
    k = (x @ w["k_proj.weight"].T).view(n, c.num_kv_heads, D)
    v = (x @ w["v_proj.weight"].T).view(n, c.num_kv_heads, D)
    positions = torch.arange(1, n + 1, dtype=torch.float64)
    inv = 1.0 / c.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.cat([positions[:, None] * inv, positions[:, None] * inv], dim=-1)
    cos, sin = angles.cos().float()[:, None], angles.sin().float()[:, None]

    def rope(t: torch.Tensor) -> torch.Tensor:
        return t * cos + torch.cat([-t[..., D // 2 :], t[..., : D // 2]], dim=-1) * sin

    q, k = rope(q), rope(k)
    groups = c.num_heads // c.num_kv_heads
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
    h = hidden + attn @ w["o_proj.weight"].T
    y = rms(h, w["post_attention_layernorm"])
    h = h + (F.silu(y @ w["gate_proj.weight"].T) * (y @ w["up_proj.weight"].T)) @ w["down_proj.weight"].T
    return (rms(h, w["norm"]) @ w["lm_head.weight"].T)[m - 1 :]


def test_k_outputs_equal_the_written_out_computation(tiny):
    """One propose = one head pass: its K distributions are the reference layer's, and a greedy chain
    is their argmaxes; the training unroll computes the same K logits at the root's entry."""
    head = parallel_head(tiny, scale=0.1)
    prompt = list(range(1000, 1012))
    features = target_features(tiny, head, prompt[:-1])
    embed = tiny.runner.embed(torch.arange(tiny.runner.vocab_size)).float()
    want = reference_logits(head, features, torch.tensor(prompt[1:]), embed)  # [K, Vd]
    layers = sorted(set(head.config.feature_layers))
    for params in (SamplingParams(temperature=1.0, seed=0), SamplingParams()):
        d = EagleDrafter(head, tiny.runner, topk=1, num_steps=K, num_draft_tokens=K, parallel=True)
        d.begin(prompt, params)
        calls = []
        step = head.step
        head.step = lambda *a, _step=step, _calls=calls: _calls.append(1) or _step(*a)  # count head passes
        slot = tiny.runner.allocate()
        states = tiny.runner.run([SeqInput(slot, prompt[:-1])], layers).hidden[0]
        tiny.runner.free(slot)
        hidden = dict(zip(layers, states, strict=True))
        d.observe(hidden)
        proposal = d.propose(prompt, K)
        del head.step
        assert len(calls) == 1 and len(proposal) == K and proposal.is_chain
        targets = head.draft_to_target(torch.arange(head.config.draft_vocab_size))
        if params.greedy:
            assert proposal.token_ids == targets[want.argmax(-1)].tolist()
        else:
            assert torch.allclose(proposal.probs[:, targets], want.softmax(-1), atol=1e-5)
    # the training unroll: entry m - 1 is the root x_{n-1}; step k its mask entry k
    n = len(prompt)
    sample = Sample(torch.tensor(prompt), n, True, torch.cat([features, torch.zeros(1, features.shape[1])]),
                    torch.zeros(n, tiny.runner.config.hidden_size))
    with torch.no_grad():
        logits = unroll(head, make_batch([sample], 1.0), embed, K, parallel=True)
    assert torch.allclose(torch.stack([lg[0, n - 2] for lg in logits]), want, atol=1e-4)


# -- checkpoints and refusals ---------------------------------------------------------------------------


def test_checkpoint_records_k_and_the_mask_entry(tiny, tmp_path):
    head = parallel_head(tiny)
    folder = save_head(head, tmp_path / "h", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == "peagle" and config["para_depths"] == K
    again = load_head(folder)
    assert again.config.parallel_tokens == K
    assert torch.equal(again.mask_hidden, head.mask_hidden) and torch.equal(again.mask_embed, head.mask_embed)


def test_a_sequential_head_with_parallel_drafting_is_one_clear_error(tiny, tiny_llama, tmp_path, capsys):
    from specdec.cli.main import main
    from tests.test_eagle3 import tiny_head

    folder = save_head(tiny_head(tiny), tmp_path / "seq")
    spec = SpecConfig(types=(SpecType.EAGLE3,), spec_model=str(folder), parallel_drafting=True)
    with pytest.raises(ModelLoadError, match="not trained for parallel drafting.*--parallel K"):
        DraftResources(spec, tiny.runner, tiny.tokenizer)
    common = ["generate", "Hi", "--model", str(tiny_llama), "--max-new-tokens", "4", "--spec-parallel-drafting"]
    for extra in (["--spec-type", "eagle3", "--spec-model", str(folder)], ["--spec-type", "ngram"]):
        capsys.readouterr()
        rc = main([*common, *extra])
        err = capsys.readouterr().err
        assert rc == 2 and err.strip().count("\n") == 0 and "parallel" in err and "Traceback" not in err


def test_vllm_parallel_drafting_key():
    spec, _ = spec_from_vllm_config(json.dumps({"method": "eagle3", "model": "h", "num_speculative_tokens": 4,
                                                "parallel_drafting": True}))
    assert spec.parallel_drafting and spec.spec_model == "h" and (spec.eagle_topk, spec.num_steps) == (1, 4)
    off = spec_from_vllm_config('{"method": "eagle3", "model": "h", "parallel_drafting": false}')[0]
    assert not off.parallel_drafting
    for bad, message in (({"method": "ngram", "parallel_drafting": True}, "eagle3"),
                         ({"method": "eagle3", "parallel_drafting": "yes"}, "true or false")):
        with pytest.raises(ValueError, match=message):
            spec_from_vllm_config(json.dumps(bad))


# -- a head trained on the peaked bigram model ------------------------------------------------------------


@pytest.fixture(scope="module")
def peaked_folder(tiny_model_factory) -> str:
    return str(tiny_model_factory("qwen2", seed=3, logit_scale=4.0, bigram=True))


@pytest.fixture(scope="module")
def peaked(peaked_folder) -> LLM:
    return LLM(peaked_folder, max_model_len=256)


def chain_prompt(peaked: LLM) -> list[int]:
    """The model's likely chain from token 300, then its start again (tests/test_lossless.sampling_case)."""
    probe = run(Engine(peaked.runner), [300], greedy(10), None).output_ids
    return [300, *probe, 300, *probe[:3]]


@pytest.fixture(scope="module")
def trained(peaked, peaked_folder, tmp_path_factory):
    """A P-EAGLE head (K = 3) trained 40 steps on the peaked model's greedy continuations."""
    out = tmp_path_factory.mktemp("peagle-train")
    layers = EagleHeadConfig.for_target(peaked.runner.config, 8).feature_layers
    prompt = chain_prompt(peaked)
    rng = random.Random(0)
    requests = [train_data.Request([*prompt[: rng.randint(1, len(prompt))], rng.randrange(300, 340)], None, i)
                for i in range(1, 40)]
    requests += [train_data.Request(p, None, 200 + i) for i, p in enumerate((prompt, [*prompt[:4], 301], [310, 311]))]
    requests += [train_data.Request(prompt, None, 100)]  # the validation sequence (tag % 20 == 0, greedy)
    writer = train_data.ShardWriter(out / "data", layers, {})
    batched = load_runner(peaked_folder, max_seq_len=256, num_slots=8)[0]  # the LLM has one slot
    train_data.generate_batched(batched, requests, layers, 24, 8, writer.add)
    writer.flush(len(requests))
    store = train_data.SampleStore(out / "data")
    head = parallel_head(peaked, vocab=choose_vocab(store.token_counts(49152), 256), scale=0.02)
    head.lm_head.weight.data.copy_(peaked.runner.output_rows(head.draft_to_target(torch.arange(256))))
    tables = Tables(peaked.runner.embed(torch.arange(49152)), head.lm_head.weight.detach().clone())
    config = TrainConfig(steps=40, lr=3e-3, warmup=5, batch_tokens=512, ttt_steps=K, eval_every=40, parallel=True)
    trainer = Trainer(head, tables, out / "data", out, config, torch.device("cpu"))
    records = []
    trainer.train(log=lambda line: records.append(json.loads(line)))
    return out, records


def parallel_spec(folder, topk: int, n: int) -> SpecConfig:
    return SpecConfig(types=(SpecType.EAGLE3,), spec_model=str(folder), eagle_topk=topk, num_steps=K,
                      num_draft_tokens=n, draft_n_max=n, parallel_drafting=True)


@pytest.mark.parametrize("topk,n", [(1, K), (3, 6)])  # a chain and a tree from the K distributions
def test_greedy_identity_trained_parallel_head(trained, peaked, topk, n):
    out, records = trained
    assert records[-1]["acceptance"][1] > 0  # the validation chain is accepted past the first mask entry
    resources = DraftResources(parallel_spec(out, topk, n), peaked.runner, peaked.tokenizer)
    prompt = chain_prompt(peaked)
    engine = Engine(peaked.runner, draft_n_max=n, plan_drafts=False)
    accepted = deep = 0
    for p in (prompt, [*prompt[:4], 301], [310, 311]):
        plain = run(engine, p, greedy(24), None).output_ids
        seq = run(engine, p, greedy(24), resources.new_drafter())
        assert seq.output_ids == plain
        accepted += seq.stats.accepted
        deep += sum(seq.stats.accepted_per_pos[1:])
    assert accepted > 0 and deep > 0, "drafts from the mask entries must be accepted too"


def test_train_cli_parallel_head(peaked, peaked_folder, tmp_path, capsys):
    """`specdec train eagle3 --parallel 2` writes a P-EAGLE head that --spec-parallel-drafting loads."""
    from specdec.cli.main import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Count to ten\nName three colours\nSay hi\n")
    rc = main(["train", "eagle3", "--target", peaked_folder, "--out", str(tmp_path / "p"), "--data", str(prompts),
               "--samples", "3", "--steps", "2", "--eval-every", "2", "--max-new-tokens", "8", "--draft-vocab", "64",
               "--parallel", "2", "--threads", "1", "--batch-size", "1"])
    assert rc == 0, capsys.readouterr().err
    head = load_head(tmp_path / "p")
    assert head.config.parallel_tokens == 2 and head.mask_embed.shape == (peaked.runner.config.hidden_size,)
    DraftResources(parallel_spec(tmp_path / "p", 1, 2), peaked.runner, peaked.tokenizer)  # loads


def test_train_cli_parallel_head_from_a_sequential_one(peaked, peaked_folder, tmp_path, capsys):
    """`--init HEAD --parallel 2` starts a P-EAGLE head at HEAD's layer and vocabulary (its mask entry
    fresh) and trains from there; a head for another target is one line."""
    from specdec.cli.main import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Count to ten\nName three colours\nSay hi\n")
    common = ["--target", peaked_folder, "--data", str(prompts), "--samples", "3", "--eval-every", "1",
              "--max-new-tokens", "8", "--threads", "1", "--batch-size", "1", "--data-dir", str(tmp_path / "data")]
    rc = main(["train", "eagle3", *common, "--out", str(tmp_path / "seq"), "--steps", "1", "--draft-vocab", "64"])
    assert rc == 0
    start = load_head(tmp_path / "seq")
    # --lr 0: the saved head is the start's, so what was copied shows exactly
    rc = main(["train", "eagle3", *common, "--out", str(tmp_path / "p"), "--steps", "1", "--lr", "0",
               "--parallel", "2", "--init", str(tmp_path / "seq")])
    assert rc == 0, capsys.readouterr().err
    head = load_head(tmp_path / "p")
    assert head.config.parallel_tokens == 2 and head.config.draft_vocab_size == 64
    assert "mask_hidden, mask_embed fresh" in capsys.readouterr().err
    for name, value in start.state_dict().items():
        torch.testing.assert_close(head.state_dict()[name], value, msg=name)
    assert head.mask_embed.abs().sum() > 0
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "seq", other, ignore=shutil.ignore_patterns("state", "checkpoints", "metrics.jsonl"))
    config = json.loads((other / "config.json").read_text())
    config["speculators_config"]["verifier"]["num_hidden_layers"] += 1
    (other / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["train", "eagle3", *common, "--out", str(tmp_path / "q"), "--steps", "1", "--init", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--init:" in err and "layers" in err


def test_server_and_bench_draft_in_parallel_losslessly(trained, peaked, peaked_folder, tmp_path, capsys):
    """--spec-parallel-drafting behind the OpenAI-style server (vLLM's "parallel_drafting" key; greedy
    text = plain's, a seeded sample answered) and in `specdec bench` (0 greedy mismatches, drafts made)."""
    from specdec.cli.main import main
    from tests.test_server import serve_like_plain

    out, _ = trained
    prompt = "Count to ten, then count back down"
    want = peaked.generate(prompt, SamplingParams(max_new_tokens=16))[0].text
    spec, _ = spec_from_vllm_config(json.dumps({"method": "eagle3", "model": str(out), "num_speculative_tokens": K,
                                                "parallel_drafting": True}))
    served = LLM(peaked_folder, spec=spec, max_model_len=256, max_num_seqs=2, plan_drafts=False)
    serve_like_plain(served, prompt, want)
    bench = tmp_path / "bench"
    rc = main(["bench", "--model", peaked_folder, "--methods", "none,eagle3", "--spec-model", str(out),
               "--spec-parallel-drafting", "--spec-eagle-topk", "1", "--spec-num-steps", str(K),
               "--spec-num-draft-tokens", str(K), "--workloads", "qa", "--limit", "1", "--max-turns", "1",
               "--max-new-tokens", "12", "--batch-sizes", "1", "--temperatures", "0", "--peers", "none",
               "--no-oracle", "--ignore-eos", "--out", str(bench)])
    assert rc == 0, capsys.readouterr().err
    runs = [json.loads(line) for line in (bench / "results.jsonl").read_text().splitlines()]
    drafted = [r for r in runs if r.get("method") == "eagle3"]
    assert drafted and all(r["greedy_mismatches"] == 0 for r in drafted) and sum(r["drafted"] for r in drafted) > 0
