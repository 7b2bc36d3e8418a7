"""Training-time test: the head unrolled on its own predictions, as EAGLE-3 trains it.

Alignment (entry j of a sequence x_0 .. x_{n-1}; g_j = the target's states of x_j;
y_t = the target's distribution after x_t)::

    entry j:   features g_j,  token x_{j+1},  rope position j + 1
    step 0:    predicts the token after x_{j+1}          -> target y_{j+1}
    step k:    reads its step k-1 output and its own step k-1 prediction,
               at position j + 1 + k                      -> target y_{j+1+k}

At step k, entry j attends to the step-0 keys of entries <= j (the real context,
as at inference) and to its own keys of steps 1..k (the draft chain so far):
exactly what a chain of k drafted tokens sees when drafting from root x_{j+1}.
Hence, on greedy responses, "steps 0..k all predict the next token" is exactly
"a greedy chain drafted from that root has k + 1 tokens accepted": the validation
acceptance here is the acceptance of drafting, not a proxy.

Parallel (P-EAGLE, ``parallel=True``): step k >= 1 reads the head's mask entry
(``EagleHead.mask_inputs``) instead of its own step k-1 output and prediction, at
the same position j + 1 + k and with the same attention: exactly the K - 1 mask
entries the drafter appends after root x_{j+1} in one pass, so every root of a
sequence trains every depth at once (speculators' ``peagle`` recipe, without its
down-sampling of positions per depth). The steps no longer depend on each other;
the loop over k only builds the per-step keys.

The head is an EAGLE-3 head or an MTP module (``MtpHead``, `specdec train mtp`):
both offer ``project``, ``qkv``, ``finish``, ``logits`` and ``draft_to_target``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.model.eagle_head import EagleHead
from specdec.train.data import Sample


@dataclass
class TTTBatch:
    """B sequences padded to T entries (T = longest n - 1); see the module docstring."""

    features: torch.Tensor  # [B, T, F] g_j
    ids: torch.Tensor  # [B, T] x_{j+1}
    positions: torch.Tensor  # [B, T] j + 1
    entry_valid: torch.Tensor  # [B, T] bool: entry j exists
    target_final: torch.Tensor  # [B, T, H] final normed state of x_{j+1} (gives y_{j+1})
    target_next: torch.Tensor  # [B, T] x_{j+2}: the token that followed (the argmax on greedy responses)
    target_valid: torch.Tensor  # [B, T] bool: y_{j+1} is known
    weight: torch.Tensor  # [B, T] loss weight of predicting x_{j+2}

    @property
    def num_tokens(self) -> int:
        return int(self.entry_valid.sum())


def make_batch(samples: list[Sample], prompt_weight: float, device: torch.device | str = "cpu") -> TTTBatch:
    T = max(len(s.token_ids) - 1 for s in samples)
    B = len(samples)
    F_, H = samples[0].features.shape[1], samples[0].final.shape[1]
    out = TTTBatch(
        features=torch.zeros(B, T, F_), ids=torch.zeros(B, T, dtype=torch.long),
        positions=torch.zeros(B, T, dtype=torch.long), entry_valid=torch.zeros(B, T, dtype=torch.bool),
        target_final=torch.zeros(B, T, H), target_next=torch.zeros(B, T, dtype=torch.long),
        target_valid=torch.zeros(B, T, dtype=torch.bool), weight=torch.zeros(B, T),
    )
    for b, s in enumerate(samples):
        n = len(s.token_ids)
        m = n - 1  # entries 0 .. n-2
        out.features[b, :m] = s.features[:m].float()
        out.ids[b, :m] = s.token_ids[1:n]
        out.positions[b, :m] = torch.arange(1, n)
        out.entry_valid[b, :m] = True
        # y_{j+1} needs the final state of x_{j+1}, known for j + 1 <= n - 2 (the last token never ran)
        out.target_final[b, : m - 1] = s.final[1 : n - 1].float()
        out.target_next[b, : m - 1] = s.token_ids[2:n]
        out.target_valid[b, : m - 1] = True
        is_response = torch.arange(2, n + 1) >= s.prompt_len  # x_{j+2} was generated
        out.weight[b, : m - 1] = torch.where(is_response[: m - 1], 1.0, prompt_weight)
    return TTTBatch(*(t.to(device) for t in vars(out).values()))


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                  entry_valid: torch.Tensor) -> torch.Tensor:
    """q [B, T, Hq, D]; keys/values per step so far [B, T, Hkv, D] -> [B, T, Hq * D] (module docstring)."""
    B, T, Hq, D = q.shape
    groups = Hq // keys[0].shape[2]
    scale = 1.0 / math.sqrt(D)
    qh = q.transpose(1, 2)  # [B, Hq, T, D]
    k0 = keys[0].repeat_interleave(groups, dim=2).transpose(1, 2)
    v0 = values[0].repeat_interleave(groups, dim=2).transpose(1, 2)
    scores = qh @ k0.transpose(-1, -2) * scale  # [B, Hq, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    allowed = causal.unsqueeze(0) & entry_valid.unsqueeze(1)  # [B, T, T] query j sees valid keys <= j
    scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    own_k = [k.repeat_interleave(groups, dim=2).transpose(1, 2) for k in keys[1:]]  # [B, Hq, T, D]
    own_v = [v.repeat_interleave(groups, dim=2).transpose(1, 2) for v in values[1:]]
    diag = [(qh * k).sum(-1, keepdim=True) * scale for k in own_k]  # [B, Hq, T, 1] each
    probs = torch.softmax(torch.cat([scores, *diag], dim=-1), dim=-1)
    out = probs[..., :T] @ v0
    for i, v in enumerate(own_v):
        out = out + probs[..., T + i : T + i + 1] * v
    return out.transpose(1, 2).reshape(B, T, Hq * D)


def unroll(head: EagleHead, batch: TTTBatch, embed_table: torch.Tensor, steps: int,
           parallel: bool = False) -> list[torch.Tensor]:
    """Draft-vocabulary logits [B, T, Vd] of each step 0..steps-1 (``parallel``: mask entries, module docstring)."""
    hidden = head.project(batch.features)
    ids, positions = batch.ids, batch.positions
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    out = []
    max_pos = head.cos.shape[0] - 1
    for step in range(steps):
        if parallel and step > 0:
            hidden, embeds = head.mask_inputs(batch.ids.shape)
        else:
            embeds = embed_table[ids]
        residual, q, k, v = head.qkv(hidden, embeds, positions.clamp(max=max_pos))
        keys.append(k)
        values.append(v)
        hidden = head.finish(residual, ttt_attention(q, keys, values, batch.entry_valid))
        logits = head.logits(hidden)
        out.append(logits)
        ids = head.draft_to_target(logits.detach().argmax(-1))
        positions = positions + 1
    return out


@dataclass
class StepMetrics:
    loss: float
    correct: list[int]  # per step: entries whose steps 0..k all matched the target's argmax
    total: int  # entries with a known target at step 0


def ttt_loss(
    head: EagleHead, batch: TTTBatch, embed_table: torch.Tensor, target_rows: torch.Tensor, steps: int,
    decay: float = 0.8, parallel: bool = False,
) -> tuple[torch.Tensor, StepMetrics]:
    """Soft cross-entropy against the target's distribution over the draft vocabulary, step k
    weighted decay**k; target_rows [Vd, H] are the target's LM-head rows of the draft vocabulary.
    Metrics count a step as right when its argmax is the token that followed (exact on greedy data)."""
    with torch.no_grad(), torch.autocast(batch.ids.device.type, enabled=False):
        target_probs = torch.softmax(batch.target_final @ target_rows.T, dim=-1)  # [B, T, Vd] float32
    logits = unroll(head, batch, embed_table, steps, parallel)
    T = batch.ids.shape[1]
    total_loss = torch.zeros((), device=batch.ids.device)
    chain = batch.target_valid.clone()  # entries whose steps so far all matched
    correct = []
    for k, lg in enumerate(logits):
        if k >= T:
            break
        lg = lg[:, : T - k]
        p = target_probs[:, k:]
        mask = batch.target_valid[:, k:]
        w = batch.weight[:, k:] * mask
        ce = -(p * F.log_softmax(lg.float(), dim=-1)).sum(-1)  # [B, T-k]
        total_loss = total_loss + decay**k * (ce * w).sum() / w.sum().clamp(min=1e-6)
        with torch.no_grad():
            hit = head.draft_to_target(lg.argmax(-1)) == batch.target_next[:, k:]
            chain = chain[:, : T - k] & hit & mask
            correct.append(int(chain.sum()))
    return total_loss, StepMetrics(float(total_loss.detach()), correct, int(batch.target_valid.sum()))


def chain_tau(correct: list[int], total: int) -> float:
    """Mean tokens per target pass of a greedy chain of len(correct) drafted tokens:
    1 (the bonus/recovered token) + the expected accepted prefix."""
    return 1.0 + sum(c / max(total, 1) for c in correct)
