"""A Q4_K GGUF re-encoded as Q5_K, losslessly (each Q4_K super-block's values with zero fifth bits): the same
model and logits' values, read through the Q5_K kernels, to measure them on a real model's shapes (no Q5_K_M
model ships in the packages this project may use).

    python scripts/q5k_model.py SRC.gguf DST.gguf
    specdec bench passes --model DST.gguf
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T


def q4k_as_q5k(data: np.ndarray) -> np.ndarray:
    """Q4_K super-blocks [rows, n x 144] -> Q5_K [rows, n x 176]: d, dmin, scales, 32 zero qh bytes, the nibbles."""
    b = data.reshape(data.shape[0], -1, 144)
    qh = np.zeros((*b.shape[:2], 32), dtype=np.uint8)
    return np.concatenate([b[..., :16], qh, b[..., 16:]], axis=-1).reshape(data.shape[0], -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    args = ap.parse_args()
    reader = gguf.GGUFReader(args.src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(args.dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    tensors = [(t, q4k_as_q5k(t.data) if t.tensor_type == T.Q4_K else t.data) for t in reader.tensors]
    for t, data in tensors:
        kind = T.Q5_K if t.tensor_type == T.Q4_K else t.tensor_type
        writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data in tensors:
        writer.write_tensor_data(data)
    writer.close()
    print(f"{args.dst}: {sum(t.tensor_type == T.Q4_K for t in reader.tensors)} Q4_K tensors as Q5_K")


if __name__ == "__main__":
    main()
