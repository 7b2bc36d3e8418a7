"""The EAGLE-3 draft head: one decoder layer over the target's own hidden states.

Per position t of the target's sequence, the head reads the target's hidden
states of token t from a low, a middle and a high layer (concatenated, 3H),
projects them to H with ``fc``, and combines them with the embedding of token
t + 1 (the target's own embedding table): the layer's attention takes
[norm(embed), norm(hidden)] (2H) and the head predicts token t + 2 over a
reduced draft vocabulary. Drafting further, the layer's output replaces the
projected features: step k reads its own step k - 1 output and the token it
predicted there.

    features [n, 3H_t] --fc--> h [n, H]      e = embed(next tokens) [n, H]
    x = [input_norm(e), hidden_norm(h)]      [n, 2H]
    h' = h + attn(x) ; h' = h' + mlp(post_norm(h'))
    logits = lm_head(norm(h'))               [n, draft_vocab]; target id = d + d2t[d]

P-EAGLE (parallel drafting, ``parallel_tokens`` K > 0; the ``speculators`` project's
``peagle`` recipe): K - 1 *mask entries* follow the root's real entry in the same
pass, each reading a learned feature vector (``mask_hidden`` [3H_t], through ``fc``)
and a learned token embedding (``mask_embed`` [H]) at positions root + 1 .. root +
K - 1 and attending causally to the real entries and the mask entries before it;
entry d's logits predict drafted token d + 1, so one head pass drafts K tokens::

    entries  [..., (g_{r-1}, x_r) @ r,  (mask, mask) @ r+1, ..., (mask, mask) @ r+K-1]
    logits   [...,  token r+1,          token r+2,      ...,  token r+K]

Weights use the names of the ``speculators`` project (``layers.0.self_attn.q_proj``,
``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d``); the original EAGLE-3 release's
``midlayer.*`` names load too (``model.eagle_checkpoint`` reads and writes both
configs). Rope uses Hugging Face's rotate-half layout, as those checkpoints do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specdec.config import ModelConfig
from specdec.errors import ModelLoadError
from specdec.model import kernels
from specdec.model.quant import QuantMatrix, int8_rows
from specdec.model.transformer import rope_table

MAX_POSITIONS = 32768  # the head drafts at positions below this
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}  # one product each


@dataclass(frozen=True)
class EagleHeadConfig:
    """Shapes of a head and how it attaches to its target.

    feature_layers: target layers read, in ``ModelRunner.run`` indexing (the state after
    layer i). Checkpoints store vLLM's ``eagle_aux_hidden_state_layer_ids`` (the input of
    layer i + 1, the same tensor), so a stored id is ours + 1.
    """

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    feature_layers: tuple[int, ...]
    target_num_layers: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 8192
    norm_before_residual: bool = False
    fc_bias: bool = False
    verifier: dict = field(default_factory=dict)  # the target it was trained for (name, sizes)
    parallel_tokens: int = 0  # K drafts per pass from mask entries (P-EAGLE); 0 = a sequential head

    @classmethod
    def for_target(
        cls, target: ModelConfig, draft_vocab_size: int, feature_layers: tuple[int, ...] | None = None,
        verifier_name: str = "", parallel_tokens: int = 0,
    ) -> EagleHeadConfig:
        """A head shaped like one layer of ``target``, reading EAGLE-3's default layers."""
        layers = feature_layers or default_feature_layers(target.num_layers)
        return cls(
            hidden_size=target.hidden_size, num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim, intermediate_size=target.intermediate_size,
            target_vocab_size=target.vocab_size, draft_vocab_size=min(draft_vocab_size, target.vocab_size),
            target_hidden_size=target.hidden_size, feature_layers=tuple(layers),
            target_num_layers=target.num_layers, rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
            rope_scaling=target.rope_scaling, max_position_embeddings=target.max_position_embeddings,
            verifier=dict(name_or_path=verifier_name, architectures=[f"{target.arch}"],
                          hidden_size=target.hidden_size, vocab_size=target.vocab_size,
                          num_hidden_layers=target.num_layers),
            parallel_tokens=parallel_tokens,
        )

    def layer_config(self) -> ModelConfig:
        """The head's layer as a ModelConfig (for the shared rope table)."""
        return ModelConfig(
            arch="llama", vocab_size=self.target_vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
        )


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low / middle / high choice (vLLM ids 2, L // 2, L - 3) in our indexing, kept
    inside the model for tiny ones: 30 layers -> (1, 14, 26); 2 layers -> (1, 0, 0)."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (1, num_layers // 2 - 1, num_layers - 4))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps)  # (bfloat16 under training's autocast)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's rotate-half rope: x [..., D] with cos/sin broadcastable to it."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class CachedLayer(nn.Module):
    """A one-layer drafting module that runs step by step over a ``HeadCache`` (EagleHead, MtpHead:
    the EAGLE drafter drives both): its ``qkv``, cached attention, its ``finish``; on a CPU its
    matrix products may run on int8 copies (``_quantize``, ``_fast``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fast: dict[str, QuantMatrix] = {}  # int8 copies for drafting on a CPU (quantize_for_cpu)

    def _quantize(self, matrices: dict[str, torch.Tensor | QuantMatrix]) -> bool:
        """Draft with int8 copies of ``matrices`` (name -> weight [N, K], or a ready QuantMatrix such
        as the target's own LM head) on the integer-dot kernels, where they load.

        A draft step reads every weight once: in float32 an EAGLE head's 8k-row LM head alone is
        19 MB, an MTP module's full-vocabulary one 113 MB on SmolLM2; int8 blocks (Q8_0's layout) read
        a quarter. Drafts only need to be good guesses, so the rounding costs no losslessness.
        Returns False (float products kept) where the kernels do not load or a width does not fit.
        """
        from specdec.model.clib import load_qkernels

        try:
            load_qkernels()
            fast = {name: m if isinstance(m, QuantMatrix) else quantize_q8(m.detach()) for name, m in matrices.items()}
        except (ModelLoadError, ValueError):  # no kernels; a width the blocks do not divide
            return False
        self.fast = fast
        return True

    def _fast(self, name: str, x: torch.Tensor) -> torch.Tensor | None:
        """x @ W.T on the int8 copy ``name``, or None where the float module must run (training, GPU)."""
        fast = self.fast.get(name)
        if fast is None or torch.is_grad_enabled() or x.device.type != "cpu":
            return None
        rows = x.reshape(-1, x.shape[-1]).float().contiguous().numpy()
        out = np.empty((rows.shape[0], fast.shape[0]), dtype=np.float32)
        kernels.qmatmul(*fast.arrays(), rows, out)
        return torch.from_numpy(out).view(*x.shape[:-1], fast.shape[0])

    def _products(self, name: str, parts: tuple[str, ...], x: torch.Tensor) -> list[torch.Tensor]:
        """x @ W.T for each matrix of ``parts``: one product on the int8 copy ``name`` (the parts
        stacked) where there is one, else each part's float product (``_float_product``)."""
        y = self._fast(name, x)
        if y is None:
            return [self._float_product(part, x) for part in parts]
        return list(y.split([self._float_matrix(part).shape[0] for part in parts], dim=-1))

    def _float_matrix(self, part: str) -> torch.Tensor:
        """The float weight [N, K] of matrix ``part``."""
        raise NotImplementedError

    def _float_product(self, part: str, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self._float_matrix(part))

    def step(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: HeadCache,
        rows: torch.Tensor,
        visible: torch.Tensor,
    ) -> torch.Tensor:
        """Run n entries; write their K/V at cache ``rows``; return the layer output [n, H].

        hidden: [n, H] the entries' features (EAGLE: projected by ``fc``; MTP: the target's state
        before each token) or a previous step's output; embeds [n, H] the tokens' embeddings;
        positions [n] rope positions; visible [n, L] which cache rows each entry attends to (itself
        included; L covers every row written so far).
        """
        residual, q, k, v = self.qkv(hidden, embeds, positions)
        return self.finish(residual, cached_attention(q, k, v, cache, rows, visible))


class EagleHead(CachedLayer):
    """Parameters of the head and its two uses: a cached decode step (drafting) and the
    unrolled training-time-test pass (``train.ttt``)."""

    def __init__(self, config: EagleHeadConfig) -> None:
        super().__init__()
        c = self.config = config
        H, D = c.hidden_size, c.head_dim
        self.fc = nn.Linear(len(c.feature_layers) * c.target_hidden_size, H, bias=c.fc_bias)
        self.input_layernorm = nn.Parameter(torch.ones(H))
        self.hidden_norm = nn.Parameter(torch.ones(H))
        self.post_attention_layernorm = nn.Parameter(torch.ones(H))
        self.q_proj = nn.Linear(2 * H, c.num_heads * D, bias=False)
        self.k_proj = nn.Linear(2 * H, c.num_kv_heads * D, bias=False)
        self.v_proj = nn.Linear(2 * H, c.num_kv_heads * D, bias=False)
        self.o_proj = nn.Linear(c.num_heads * D, H, bias=False)
        self.gate_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, H, bias=False)
        self.norm = nn.Parameter(torch.ones(H))
        self.lm_head = nn.Linear(H, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))  # target = d + d2t[d]
        self.register_buffer("t2d", torch.zeros(c.target_vocab_size, dtype=torch.bool))  # in the draft vocab
        if c.parallel_tokens:  # P-EAGLE's mask entry: learned features (before fc) and token embedding
            self.mask_hidden = nn.Parameter(0.02 * torch.randn(len(c.feature_layers) * c.target_hidden_size))
            self.mask_embed = nn.Parameter(0.02 * torch.randn(H))
        # [L, D/2] complex; capped: a 128k-context target would otherwise cost 128 MB of tables
        self.max_positions = min(c.max_position_embeddings, MAX_POSITIONS)
        cos, sin = rotate_half_tables(c.layer_config(), self.max_positions)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    # -- pieces ------------------------------------------------------------------------------
    def quantize_for_cpu(self) -> bool:
        """Draft with int8 copies of the matrices (``CachedLayer._quantize``; q/k/v and gate/up fused):
        they also stay in L3 across the steps of a draft."""
        weight = lambda name: getattr(self, name).weight.detach()  # noqa: E731
        matrices = {name: weight(name) for name in ("fc", "o_proj", "down_proj", "lm_head")}
        matrices |= {fused: torch.cat([weight(n) for n in parts]) for fused, parts in FUSED.items()}
        return self._quantize(matrices)

    def _float_matrix(self, part: str) -> torch.Tensor:
        return getattr(self, part).weight

    def _float_product(self, part: str, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, part)(x)  # the module, its bias included

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        y = self._fast(name, x)
        if y is None:
            return getattr(self, name)(x)
        bias = getattr(self, name).bias
        return y if bias is None else y + bias

    def _fused(self, name: str, x: torch.Tensor) -> list[torch.Tensor]:
        """The products of FUSED[name] on x (one int8 product when quantized)."""
        return self._products(name, FUSED[name], x)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [..., 3H_t] -> [..., H] (``fc``)."""
        return self._linear("fc", features)

    def mask_inputs(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, embeds) [*shape, H] of P-EAGLE mask entries: ``fc(mask_hidden)`` and ``mask_embed``."""
        hidden = self.project(self.mask_hidden.unsqueeze(0))[0]
        H = self.config.hidden_size
        return hidden.expand(*shape, H), self.mask_embed.expand(*shape, H)

    def set_vocab(self, draft_to_target: torch.Tensor) -> None:
        """Draft vocabulary = these target ids (ascending), stored as EAGLE-3's d2t offsets and t2d mask."""
        ids = draft_to_target.to(self.d2t.device, torch.long)
        self.d2t.copy_(ids - torch.arange(len(ids), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def qkv(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor):
        """Layer input -> (residual, q [..., n, Hq, D], k, v [..., n, Hkv, D]) with rope applied."""
        c = self.config
        h = rms_norm(hidden, self.hidden_norm, c.rms_norm_eps)
        residual = h if c.norm_before_residual else hidden
        x = torch.cat([rms_norm(embeds, self.input_layernorm, c.rms_norm_eps), h], dim=-1)
        shape = x.shape[:-1]
        q, k, v = self._fused("qkv", x)
        q = q.reshape(*shape, c.num_heads, c.head_dim)
        k = k.reshape(*shape, c.num_kv_heads, c.head_dim)
        v = v.reshape(*shape, c.num_kv_heads, c.head_dim)
        cos, sin = self.cos[positions].unsqueeze(-2), self.sin[positions].unsqueeze(-2)
        return residual, rotate(q, cos, sin), rotate(k, cos, sin), v

    def finish(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Attention output [..., Hq * D] -> the layer's output hidden state [..., H]."""
        h = residual + self._linear("o_proj", attn)
        x = rms_norm(h, self.post_attention_layernorm, self.config.rms_norm_eps)
        gate, up = self._fused("gate_up", x)
        return h + self._linear("down_proj", F.silu(gate) * up)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Layer output [..., H] -> draft-vocabulary logits [..., draft_vocab]."""
        return self._linear("lm_head", rms_norm(hidden, self.norm, self.config.rms_norm_eps))


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: HeadCache, rows: torch.Tensor,
                     visible: torch.Tensor) -> torch.Tensor:
    """A head layer's attention over its own cache: write k, v [n, Hkv, D] at ``rows``, then each of
    the n queries q [n, Hq, D] attends to the cache rows ``visible`` [n, L] marks -> [n, Hq * D]."""
    cache.k[rows] = k
    cache.v[rows] = v
    L = visible.shape[1]
    keys = cache.k[:L].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
    values = cache.v[:L].transpose(0, 1).unsqueeze(0)
    attn = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), keys, values, attn_mask=visible.unsqueeze(0).unsqueeze(0),
        enable_gqa=True,
    )  # [1, Hq, n, D]
    return attn[0].transpose(0, 1).reshape(len(rows), -1)


def rotate_half_tables(config: ModelConfig, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_positions, head_dim] of ``config``'s rope in Hugging Face's rotate-half layout."""
    table = rope_table(config, config.rope_theta, max_positions)
    angles = torch.cat([table.angle(), table.angle()], dim=-1)
    return angles.cos(), angles.sin()


def quantize_q8(weight: torch.Tensor) -> QuantMatrix:
    """[rows, k] float -> int8 blocks of 32 with a float16 scale each (Q8_0's values), interleaved."""
    return int8_rows(weight.detach().float().cpu().numpy())


class HeadCache:
    """The head's own K/V for one sequence: rows in the order entries were run, grown on demand.
    ``config``: anything with ``num_kv_heads`` and ``head_dim`` (a head's config, a ModelConfig)."""

    def __init__(self, config: EagleHeadConfig | ModelConfig, device: torch.device | str = "cpu",
                 capacity: int = 256) -> None:
        self.shape = (config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(capacity, *self.shape, device=device)
        self.v = torch.zeros(capacity, *self.shape, device=device)

    def reserve(self, rows: int) -> None:
        if rows > self.k.shape[0]:
            size = max(rows, 2 * self.k.shape[0])
            for name in ("k", "v"):
                old = getattr(self, name)
                new = old.new_zeros(size, *self.shape)
                new[: old.shape[0]] = old
                setattr(self, name, new)
