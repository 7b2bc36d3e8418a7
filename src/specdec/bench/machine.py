"""The machine a run measured: the CPU (model, vendor, its SIMD flags), memory and software, as every table names it."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_info() -> dict:
    model, vendor, flags = platform.processor() or "unknown", "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "vendor_id" and not vendor:
                vendor = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    simd = [f for f in ("fma", "avx2", "avx512f", "avx512bw", "avx_vnni", "avx512_vnni", "avx512_bf16", "amx_tile")
            if f in flags]
    return {"cpu": model, "vendor": vendor, "cores": os.cpu_count(), "avx2": "avx2" in flags,
            "avx512": "avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags, "amx": any(f.startswith("amx") for f in flags),
            "simd": " ".join(simd) or "none"}


def machine_info() -> dict:
    import torch
    import transformers

    info = cpu_info()
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        mem = 0
    info.update(memory_gib=round(mem / (1 << 30), 1), python=platform.python_version(),
                torch=torch.__version__, transformers=transformers.__version__, os=platform.platform())
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info
