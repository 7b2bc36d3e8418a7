"""The GGUF header reader (``gguf_header``) against gguf's own ``GGUFReader`` on files written by its ``GGUFWriter``."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter, quants

from specdec.errors import ModelLoadError
from specdec.model.gguf_header import read_header, tensor_data


def write_gguf(path, alignment: int | None = None) -> None:
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint32("llama.block_count", 2)
    writer.add_float32("llama.rope.freq_base", 10000.5)
    writer.add_bool("general.flag", True)
    writer.add_int64("general.big", -(2**40))
    writer.add_float64("general.f64", 0.1)
    writer.add_string("general.name", "tiny — ünïcode")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bé", "", "<s>"] * 50)
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0])
    writer.add_array("general.nested", [[1, 2], [3]])
    writer.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    writer.add_tensor("q8", quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q8_0), raw_dtype=T.Q8_0)
    writer.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_header_is_gguf_readers_without_the_arrays(tmp_path, alignment):
    path = tmp_path / "t.gguf"
    write_gguf(path, alignment)
    header, reader = read_header(path), GGUFReader(str(path))
    want = {key: f.contents() for key, f in reader.fields.items() if not key.startswith("GGUF.")}
    assert header.metadata == {key: v for key, v in want.items() if not isinstance(v, list)}
    assert header.metadata["general.name"] == "tiny — ünïcode" and "tokenizer.ggml.tokens" not in header.metadata
    assert list(header.tensors) == [t.name for t in reader.tensors] == ["f32", "f16", "q8", "i32"]
    for t in reader.tensors:
        ours = header.tensors[t.name]
        assert ours == (t.name, t.tensor_type, tuple(int(n) for n in t.shape), t.n_elements, t.n_bytes, t.data_offset)
        data = tensor_data(path, ours)
        assert data.dtype == t.data.dtype and data.shape == t.data.shape and np.array_equal(data, t.data)
    assert header.tensors["q8"].n_bytes == 4 * 2 * 34 and tensor_data(path, header.tensors["q8"]).shape == (4, 68)


def test_a_bad_file_is_a_model_load_error(tmp_path):
    path = tmp_path / "t.gguf"
    write_gguf(path)
    raw = path.read_bytes()
    for name, content in [("cut.gguf", raw[:200]), ("text.gguf", b"not a model at all"), ("empty.gguf", b"")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ModelLoadError, match=f"cannot read GGUF .*{name}"):
            read_header(tmp_path / name)
    huge = raw[:24] + (2**62).to_bytes(8, "little") + raw[32:]  # the first key's length, corrupt
    (tmp_path / "huge.gguf").write_bytes(huge)
    with pytest.raises(ModelLoadError, match="ends inside its header"):
        read_header(tmp_path / "huge.gguf")
    (tmp_path / "v9.gguf").write_bytes(raw[:4] + (9).to_bytes(4, "little") + raw[8:])
    with pytest.raises(ModelLoadError, match="version 9"):
        read_header(tmp_path / "v9.gguf")
