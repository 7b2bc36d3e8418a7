"""draft-mtp: the target's own multi-token-prediction module drafts a chain.

The module (``model.mtp_head``, loaded from the target's checkpoint by
``model.mtp_checkpoint``) reads the target's final hidden state at position
p - 1 and the token at p, and predicts the token at p + 1; for more tokens it
reads its own output and the token it just drafted, K = --spec-draft-n-max times
in all. That is the EAGLE drafter's loop with one child per node, so this drafter
is ``EagleDrafter`` with topk 1 over the MTP head: the same real entries per
committed position in the module's one-layer cache (fed by ``observe``), the same
catch-up and rollback, the same draws from the module's q under the request's
sampling settings, handed to the verifier (exact under sampling).
"""

from __future__ import annotations

from specdec.config import SpecConfig
from specdec.drafters.base import DraftSetup, SharedState
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.heads import load_mtp_head
from specdec.model.mtp_head import MtpHead
from specdec.runners.base import ModelRunner


class MtpDrafter(EagleDrafter):
    name = "draft-mtp"

    def __init__(self, head: MtpHead, target: ModelRunner, num_tokens: int) -> None:
        super().__init__(head, target, topk=1, num_steps=num_tokens, num_draft_tokens=num_tokens)  # type: ignore[arg-type]

    @classmethod
    def from_config(cls, spec: SpecConfig, mtp_head: MtpHead | None = None,
                    target: ModelRunner | None = None) -> MtpDrafter:
        """``mtp_head``: the MTP module of the engine's target; ``target``: the target runner (its embeddings)."""
        if mtp_head is None or target is None:
            raise ValueError("draft-mtp needs the target's MTP module and the target runner (see DraftResources)")
        return cls(mtp_head, target, spec.draft_n_max)

    @classmethod
    def shared_state(cls, setup: DraftSetup) -> SharedState:
        # the target checkpoint's module, or one trained for it (`specdec train mtp`, --spec-model)
        return SharedState(load_mtp_head(setup.spec.spec_model or setup.target_model, setup.target))

    @classmethod
    def from_shared(cls, spec: SpecConfig, shared: MtpHead, target: ModelRunner | None) -> MtpDrafter:
        return cls.from_config(spec, mtp_head=shared, target=target)
