"""Reading config.json: what the native decoder implements is read, what it does not is refused."""

from __future__ import annotations

import json

import pytest

from specdec.errors import ModelLoadError
from specdec.model.weights import read_model_config

LLAMA = dict(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, eos_token_id=2,
)


def read(tmp_path, **fields):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **fields}))
    return read_model_config(tmp_path)[0]


def test_rope_scaling_types_the_decoder_implements(tmp_path):
    assert read(tmp_path).rope_scaling is None
    assert read(tmp_path, rope_scaling={"rope_type": "default"}).rope_scaling is None
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    assert read(tmp_path, rope_scaling=llama3).rope_scaling == llama3
    legacy = {"type": "linear", "factor": 2.0}  # older configs name the kind "type"
    assert read(tmp_path, rope_scaling=legacy).rope_scaling == legacy


@pytest.mark.parametrize("fields,message", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "'yarn' rope scaling"),
    (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "'dynamic' rope scaling"),
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
])
def test_what_the_decoder_would_ignore_is_refused(tmp_path, fields, message):
    with pytest.raises(ModelLoadError, match=message):
        read(tmp_path, **fields)


def test_unset_softcapping_and_other_architectures_pass(tmp_path):
    assert read(tmp_path, attn_logit_softcapping=None, final_logit_softcapping=30.0).final_logit_softcapping == 30.0
    assert read(tmp_path, model_type="gpt2") is None  # not native: the generic runner takes it
