"""`specdec models`: the catalog's names, sizes, whether each is installed, and the command that installs it."""

from __future__ import annotations

import argparse
import json

from specdec import catalog


def add_models_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="a JSON array, one object per model")


def model_rows() -> list[dict]:
    rows = []
    for m in catalog.MODELS:
        st = catalog.state(m)
        rows.append({"name": m.name, "description": m.description, "size": m.size, "sha256": m.sha256,
                     "file_name": m.file_name, "packages": [c.package for c in m.chunks], "status": st.label,
                     "ready": st.ready, "file_ready": st.file_ready, "missing": list(st.missing),
                     "install": m.install, "extra": m.extra})
    return rows


def cmd_models(args: argparse.Namespace) -> int:
    rows = model_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'NAME':<20} {'SIZE':>8}  {'STATUS':<42} DESCRIPTION")
    for r in rows:
        print(f"{r['name']:<20} {r['size'] / 1e6:>5.0f} MB  {r['status']:<42} {r['description']}")
    print("\ninstall (then --model NAME):")
    for r in rows:
        extra = f"   # or pip install -e '.[{r['extra']}]'" if r["extra"] else ""
        print(f"  {r['name']:<20} {r['install']}{extra}")
    return 0
