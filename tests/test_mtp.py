"""draft-mtp: MTP modules shipped inside tiny random checkpoints, written here in each layout.

The target is a one-layer bigram model (attention outputs zeroed: its next token depends
on the last token only) whose embedding rows have RMS 1. Its MTP module copies the
target's layer, norm and head, with ``eh_proj = [I, noise]``: without noise the module
computes exactly the target's next-token logits from the token's embedding, so its
drafts track the target; the noise on the hidden-state half makes some of them wrong.
Drafts are then accepted and rejected, both of which the identity test asserts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.config import SamplingParams, SpecType
from specdec.drafters.heads import load_mtp_head
from specdec.errors import ModelLoadError
from specdec.llm import LLM
from specdec.model.eagle_head import HeadCache
from specdec.model.mtp_checkpoint import check_supported, read_mtp_weights
from specdec.model.weights import read_model_config
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner
from tests.conftest import build_tiny_model

H = 64
BLOCK = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
         "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
         "mlp.up_proj.weight", "mlp.down_proj.weight")


def add_mtp(folder: Path, layout: str, noise: float, attention: float, seed: int = 0) -> Path:
    """Give ``folder``'s one-layer model unit-RMS embeddings and an MTP module in ``layout``, its
    own attention output scaled by ``attention`` (0: the target's next-token function exactly)."""
    file = folder / "model.safetensors"
    w = load_file(file)
    embed = w["model.embed_tokens.weight"]
    embed = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()  # enorm(e) == e
    w["model.embed_tokens.weight"] = embed
    gen = torch.Generator().manual_seed(seed)
    eh_proj = torch.cat([torch.eye(H), noise * torch.randn(H, H, generator=gen) / H**0.5], dim=1)
    block = {name: w[f"model.layers.0.{name}"].clone()
             for name in (*BLOCK, "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                          "self_attn.q_norm.weight", "self_attn.k_norm.weight") if f"model.layers.0.{name}" in w}
    block["self_attn.o_proj.weight"] = attention * torch.randn(H, H, generator=gen)
    ones = torch.ones(H)
    if layout == "deepseek":
        p = "model.layers.1."
        w |= {p + "enorm.weight": ones, p + "hnorm.weight": ones.clone(), p + "eh_proj.weight": eh_proj,
              p + "shared_head.norm.weight": w["model.norm.weight"].clone(),
              p + "shared_head.head.weight": w.get("lm_head.weight", embed).clone(),
              p + "embed_tokens.weight": embed.clone()}
        w |= {p + k: v for k, v in block.items()}
    else:
        w |= {"mtp.pre_fc_norm_embedding.weight": ones, "mtp.pre_fc_norm_hidden.weight": ones.clone(),
              "mtp.fc.weight": eh_proj, "mtp.norm.weight": w["model.norm.weight"].clone()}
        w |= {"mtp.layers.0." + k: v for k, v in block.items()}
    save_file({k: v.contiguous() for k, v in w.items()}, str(file), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory, default_model_folder) -> dict[str, Path]:
    """deepseek, qwen: modules whose attention and hidden-state input count (for the computation
    test); tracking: one close to the target (drafts accepted, some rejected)."""
    out = {}
    for name, arch, layout, noise, attention in (("deepseek", "llama", "deepseek", 1.0, 0.3),
                                                 ("qwen", "qwen3", "qwen3-next", 1.0, 0.3),
                                                 ("tracking", "llama", "deepseek", 0.05, 0.001)):
        folder = build_tiny_model(tmp_path_factory.mktemp(f"mtp-{name}"), arch, default_model_folder, seed=5,
                                  num_layers=1, bigram=True)
        out[name] = add_mtp(folder, layout, noise, attention)
    return out


# -- the module's computation, written out ----------------------------------------------------------------


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference_logits(w: dict[str, torch.Tensor], prefix: str, names: dict[str, str], cfg, hidden: torch.Tensor,
                     tokens: list[int], embed: torch.Tensor, head: torch.Tensor, mask_first: bool) -> torch.Tensor:
    """Entries j = 0..n-1: (target's normed hidden of token j, token j + 1), causal, rotate-half rope at
    j + 1; returns [n, V] logits, as Hugging Face's decoder layer computes them."""
    eps, D = cfg.rms_norm_eps, cfg.head_dim
    n = len(tokens)
    e = embed[torch.tensor(tokens)].clone()
    if mask_first:
        e[0] = 0
    get = lambda k: w[prefix + k].float()  # noqa: E731
    x = torch.cat([rms(e, get(names["enorm"]), eps), rms(hidden, get(names["hnorm"]), eps)], -1) @ get(names["fc"]).T
    b = get(names["block"] + "input_layernorm.weight")
    h = rms(x, b, eps)
    blk = names["block"]

    def proj(kind: str, heads: int) -> torch.Tensor:
        y = h @ get(f"{blk}self_attn.{kind}_proj.weight").T
        if prefix + f"{blk}self_attn.{kind}_proj.bias" in w:
            y = y + get(f"{blk}self_attn.{kind}_proj.bias")
        y = y.view(n, heads, D)
        if kind != "v" and prefix + f"{blk}self_attn.{kind}_norm.weight" in w:
            y = rms(y, get(f"{blk}self_attn.{kind}_norm.weight"), eps)
        return y

    q, k, v = proj("q", cfg.num_heads), proj("k", cfg.num_kv_heads), proj("v", cfg.num_kv_heads)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.outer(torch.arange(1, n + 1, dtype=torch.float64), inv).float()
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rot = lambda t: t * cos + torch.cat([-t[..., D // 2:], t[..., : D // 2]], -1) * sin  # noqa: E731
    q, k = rot(q), rot(k)
    rep = cfg.num_heads // cfg.num_kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / D**0.5
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
    x = x + attn @ get(f"{blk}self_attn.o_proj.weight").T
    m = rms(x, get(f"{blk}post_attention_layernorm.weight"), eps)
    gate, up = m @ get(f"{blk}mlp.gate_proj.weight").T, m @ get(f"{blk}mlp.up_proj.weight").T
    x = x + (torch.nn.functional.silu(gate) * up) @ get(f"{blk}mlp.down_proj.weight").T
    return rms(x, get(names["norm"]), eps) @ head.T


NAMES = {
    "deepseek": ("model.layers.1.", dict(enorm="enorm.weight", hnorm="hnorm.weight", fc="eh_proj.weight",
                                         norm="shared_head.norm.weight", block="")),
    "qwen": ("mtp.", dict(enorm="pre_fc_norm_embedding.weight", hnorm="pre_fc_norm_hidden.weight", fc="fc.weight",
                          norm="norm.weight", block="layers.0.")),
}


@pytest.mark.parametrize("name", ["deepseek", "qwen"])
def test_module_logits_equal_the_written_out_computation(models, name):
    """Loader names and shapes, then the module's logits at every entry of a context (run as one
    causal step over its own cache) against the computation above, from the file's tensors."""
    runner, _ = load_runner(str(models[name]), max_seq_len=64, backend="torch")
    head = load_mtp_head(str(models[name]), runner)
    assert head.config.layout == ("deepseek" if name == "deepseek" else "qwen3-next")
    assert head.eh_proj.shape == (H, 2 * H) and head.lm_head.shape == (49152, H)
    assert head.config.block.qk_norm == (name == "qwen")
    tokens = [1, 504, 3458, 282, 4649, 314, 216, 1035]
    hidden = runner.run([SeqInput(runner.allocate(), tokens)], hidden_layers=(-1,)).hidden[0][0]
    n = len(tokens) - 1

    def module_logits() -> torch.Tensor:
        with torch.no_grad():
            out = head.step(hidden[:n], runner.embed(torch.tensor(tokens[1:])), torch.arange(1, n + 1),
                            HeadCache(head.config), torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
            return head.logits(out)

    w = load_file(models[name] / "model.safetensors")
    prefix, names = NAMES[name]
    embed = w["model.embed_tokens.weight"]
    lm = w.get("model.layers.1.shared_head.head.weight", w.get("lm_head.weight", embed))
    want = reference_logits(w, prefix, names, head.config.block, hidden[:n], tokens[1:], embed, lm,
                            mask_first=name == "deepseek")
    # on a CPU the loader gave the module int8 copies of every matrix (drafting: int8 rounding) ...
    assert set(head.fast) == {"eh_proj", "qkv", "o_proj", "gate_up", "down_proj", "lm_head"}
    got = module_logits()
    assert (got - want).abs().max() <= 0.05 * want.abs().max()
    # ... and the float products are the written-out computation
    head.fast = {}
    torch.testing.assert_close(module_logits(), want, rtol=1e-4, atol=1e-4)


def test_a_shared_lm_head_drafts_on_the_targets_own_quantized_rows(models, tmp_path):
    """A module without its own head (a trained one, here the tracking model's) on a quantized target
    reads the target's LM-head blocks: no second int8 copy of a vocabulary-sized matrix."""
    folder = tmp_path / "headless"
    shutil.copytree(models["tracking"], folder)
    w = load_file(folder / "model.safetensors")
    assert w.pop("model.layers.1.shared_head.head.weight", None) is not None
    save_file(w, str(folder / "model.safetensors"))
    runner, _ = load_runner(str(folder), max_seq_len=64, quantization="q8_0")
    head = load_mtp_head(str(folder), runner)
    assert head.fast["lm_head"] is runner.model.quantized["lm_head"]
    own = load_mtp_head(str(models["tracking"]), runner)  # a module with its own head: its own copy
    assert own.fast["lm_head"] is not runner.model.quantized["lm_head"]


def test_greedy_output_is_identical_and_drafts_are_accepted(models):
    llm = LLM(str(models["tracking"]), spec="draft-mtp", max_model_len=256, plan_drafts=False)
    plain = LLM(str(models["tracking"]), spec="none", max_model_len=256)
    params = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    prompts = ["The quick brown fox", "def add(a, b):", "Once upon a time"]
    want = plain.generate(prompts, params)
    counts = {}
    for products in ("int8", "float"):  # the CPU's int8 drafting copies (the default), then float
        got = llm.generate(prompts, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        counts[products] = sum(o.stats.drafted for o in got), sum(o.stats.accepted for o in got)
        llm.drafts.state(SpecType.DRAFT_MTP).fast = {}
    print(counts)
    drafted, accepted = counts["float"]
    assert drafted > 40 and drafted // 3 < accepted < drafted  # accepted and rejected both
    # int8 rounding flips this tiny module's near-ties (62% -> 25% kept), drafts still accepted
    drafted, accepted = counts["int8"]
    assert drafted > 40 and drafted // 8 < accepted < drafted


# -- the GGUF layout ---------------------------------------------------------------------------------------


def test_gguf_nextn_tensors_load_as_the_safetensors_module(models, tmp_path):
    """llama.cpp's names (blk.{n}.nextn.*, the block under blk.{n}.*, n = block_count - nextn layers)
    and its q/k row interleave for the llama architecture: the same weights as the safetensors module."""
    from gguf import GGUFWriter

    folder = models["deepseek"]
    cfg, _ = read_model_config(folder)
    hf, _ = read_mtp_weights(folder, cfg)
    w = {k: v.numpy() for k, v in load_file(folder / "model.safetensors").items() if k.startswith("model.layers.1.")}
    path = tmp_path / "nextn.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_uint32("llama.nextn_predict_layers", 1)

    def interleave(x: np.ndarray, heads: int) -> np.ndarray:  # llama.cpp's permute()
        return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    gguf = {"enorm.weight": "nextn.enorm", "hnorm.weight": "nextn.hnorm", "eh_proj.weight": "nextn.eh_proj",
            "shared_head.norm.weight": "nextn.shared_head_norm", "shared_head.head.weight": "nextn.shared_head_head",
            "embed_tokens.weight": "nextn.embed_tokens", "input_layernorm.weight": "attn_norm",
            "post_attention_layernorm.weight": "ffn_norm", "self_attn.q_proj.weight": "attn_q",
            "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
            "self_attn.o_proj.weight": "attn_output", "mlp.gate_proj.weight": "ffn_gate",
            "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down"}
    for name, theirs in gguf.items():
        x = w["model.layers.1." + name]
        x = interleave(x, cfg.num_heads) if theirs == "attn_q" else interleave(x, cfg.num_kv_heads) \
            if theirs == "attn_k" else x
        writer.add_tensor(f"blk.1.{theirs}.weight", np.ascontiguousarray(x, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    got, layout = read_mtp_weights(path, cfg)
    assert layout == "gguf" and sorted(got) == sorted(hf)
    for name in hf:
        torch.testing.assert_close(got[name], hf[name], rtol=0, atol=0, msg=name)


# -- errors: one line each ---------------------------------------------------------------------------------


def test_a_missing_tensor_is_named(models, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(models["deepseek"], folder)
    w = load_file(folder / "model.safetensors")
    del w["model.layers.1.hnorm.weight"]
    save_file(w, str(folder / "model.safetensors"))
    cfg, _ = read_model_config(folder)
    with pytest.raises(ModelLoadError, match=r"weight model\.layers\.1\.hnorm\.weight missing"):
        read_mtp_weights(folder, cfg)


def test_a_target_without_mtp_tensors_is_one_clear_error(tiny_llama):
    with pytest.raises(ModelLoadError, match="has no MTP module"):
        LLM(str(tiny_llama), spec="draft-mtp", max_model_len=64)


@pytest.mark.parametrize("raw, message", [
    ({"model_type": "qwen3_next", "num_experts": 512}, "need recurrent-state rollback first"),
    ({"model_type": "qwen3_5", "text_config": {"layer_types": ["linear_attention"]}}, "recurrent-state rollback"),
    ({"model_type": "deepseek_v3", "n_routed_experts": 256}, "mixture-of-experts"),
    ({"model_type": "glm4_moe", "n_routed_experts": 128}, "mixture-of-experts"),
    ({"model_type": "mimo"}, "does not run mimo MTP blocks"),
])
def test_unsupported_architectures_are_refused(raw, message):
    with pytest.raises(ModelLoadError, match=message):
        check_supported(None, raw)


def test_vllms_mtp_method_selects_draft_mtp():
    from specdec.server.cli import spec_from_vllm_config

    spec, _ = spec_from_vllm_config('{"method": "mtp", "num_speculative_tokens": 2}')
    assert spec.types == (SpecType.DRAFT_MTP,) and spec.draft_n_max == 2


def test_a_gguf_without_nextn_tensors_is_one_clear_error(models, tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "plain.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(H, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cfg, _ = read_model_config(models["deepseek"])
    with pytest.raises(ModelLoadError, match="has no nextn tensors"):
        read_mtp_weights(path, cfg)


def test_cli_reports_a_target_without_mtp_in_one_line(tiny_llama):
    from tests.test_cli import specdec

    out = specdec("generate", "hi", "--model", str(tiny_llama), "--spec-type", "draft-mtp", "--max-new-tokens", "2")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "has no MTP module" in lines[0]



# -- the server and the bench ------------------------------------------------------------------------------


def test_server_and_bench_draft_with_the_module_losslessly(models, tmp_path, capsys):
    """draft-mtp behind the OpenAI-style server (greedy text = plain's, a seeded sample answered) and in
    `specdec bench` (0 greedy mismatches, drafts made and kept)."""
    from specdec.cli.main import main
    from tests.test_server import serve_like_plain

    folder = str(models["tracking"])
    prompt = "The quick brown fox"
    want = LLM(folder, spec="none", max_model_len=256).generate(prompt, SamplingParams(max_new_tokens=16))[0].text
    served = LLM(folder, spec="draft-mtp", max_model_len=256, max_num_seqs=2, plan_drafts=False)
    serve_like_plain(served, prompt, want)
    out = tmp_path / "bench"
    rc = main(["bench", "--model", folder, "--methods", "none,draft-mtp", "--workloads", "qa", "--limit", "1",
               "--max-turns", "1", "--max-new-tokens", "12", "--batch-sizes", "1", "--temperatures", "0",
               "--peers", "none", "--no-oracle", "--ignore-eos", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    mtp = [r for r in runs if r.get("method") == "draft-mtp"]
    assert mtp and all(r["greedy_mismatches"] == 0 for r in mtp)
    assert sum(r["drafted"] for r in mtp) > 0 and sum(r["accepted"] for r in mtp) > 0
