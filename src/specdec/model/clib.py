"""Build ``qkernels.c`` for this CPU on first use and load it where numba's code can call it.

The quantized products need integer dot instructions (vpmaddubsw, vpdpbusd) that
numba does not emit, so they are C, compiled with ``-march=native``: the CPU at hand
is detected by the compiler, never assumed. The library is cached under
``~/.cache/specdec/kernels`` keyed by the source, the compiler and the CPU's flags, and
loaded into LLVM's symbol table so that jitted code calls its functions by name.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import llvmlite.binding as llvm

from specdec.errors import ModelLoadError

SOURCE = Path(__file__).with_name("qkernels.c")
# included by SOURCE: part of the build's key
HEADERS = tuple(Path(__file__).with_name(f"qkernels_{h}.h") for h in ("x8", "amx", "x16", "attention"))
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", "-std=c11"]
EXTRA_FLAGS = "SPECDEC_QKERNELS_CFLAGS"  # e.g. "-mno-avx512f" to measure the AVX2 path on an AVX-512 CPU


def _cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec")) / "kernels"


@functools.cache
def _cpu_lines() -> dict[str, str]:
    """/proc/cpuinfo's first vendor_id and flags lines (what -march=native reads, and the vendor,
    which decides the weights' prefetch: qkernels_x8.h's PF_HINT)."""
    lines: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key = line.split(":")[0].strip()
            if key in ("vendor_id", "flags", "Features"):
                lines.setdefault("flags" if key == "Features" else key, line)
    except OSError:
        pass
    return lines


def cpu_has_amx() -> bool:
    """Whether the CPU says it has AMX int8 tiles (the kernels still ask Linux for them at run time)."""
    return " amx_int8" in _cpu_lines().get("flags", "")


def _build_flags(cpu: dict[str, str]) -> list[str]:
    vendor = ["-DSD_INTEL"] if "GenuineIntel" in cpu.get("vendor_id", "") else []
    if "AuthenticAMD" in cpu.get("vendor_id", "") and " avx512f" not in cpu.get("flags", ""):
        vendor.append("-DSD_AMD_PF1")  # Zen 1-3: the 1-row tiles prefetch too (qkernels_x8.h's PF_AHEAD1)
    return FLAGS + vendor + os.environ.get(EXTRA_FLAGS, "").split()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@functools.cache
def build_key() -> str:
    """The library's build: its source, compiler, flags and CPU ("none" without a compiler)."""
    cc = _compiler()
    if cc is None:
        return "none"
    source = SOURCE.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    cpu = _cpu_lines()
    cpu_id = cpu.get("flags", platform.processor())
    flags = " ".join(_build_flags(cpu))
    return hashlib.sha256(source + cc.encode() + flags.encode() + cpu_id.encode()).hexdigest()[:16]


def numba_cache_dir() -> Path:
    """Where numba caches the code that calls this build: one folder per build, so a process that
    loads another build (SPECDEC_QKERNELS_CFLAGS, a new compiler) never loads code compiled beside a
    different library (a shared cache once segfaulted the portable build's process)."""
    return _cache_dir() / f"numba-{build_key()}"


@functools.cache
def load_qkernels() -> ctypes.CDLL:
    """The compiled library (built once per source, compiler and CPU); raises ModelLoadError."""
    cc = _compiler()
    if cc is None:
        raise ModelLoadError("no C compiler (cc) to build the quantized kernels")
    flags = _build_flags(_cpu_lines())
    lib = _cache_dir() / f"qkernels-{build_key()}.so"
    if not lib.is_file():
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_name(f"{lib.name}.tmp{os.getpid()}")
        done = subprocess.run([cc, *flags, str(SOURCE), "-o", str(tmp), "-lm"], capture_output=True, text=True)
        if done.returncode != 0:
            raise ModelLoadError(f"cannot build the quantized kernels with {cc}: {done.stderr.strip()[-500:]}")
        tmp.replace(lib)  # atomic: a concurrent build never loads a half-written file
    llvm.load_library_permanently(str(lib))
    handle = ctypes.CDLL(str(lib))
    handle.sd_isa.restype = ctypes.c_char_p
    return handle


def wide_groups() -> bool:
    """Whether the K-quant matrices pack 16 rows a group (qkernels_x16.h): the AVX-512 kernels' layout
    (the AMX tiles pair 8-row groups, and the narrower paths read 16-row ones in portable C)."""
    return isa() == "avx512-vnni"


def isa() -> str:
    """Which instruction set the kernels run here: avx512-vnni(+amx), avx2-vnni, avx2 or scalar."""
    return load_qkernels().sd_isa().decode()
