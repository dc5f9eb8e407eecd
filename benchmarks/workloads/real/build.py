"""Build the real workloads into the cache: ``python benchmarks/workloads/real/build.py``.

Fetches what is missing (the site of pinned packages, the sdists; see sources.py), then writes
``<workloads>/real/<name>/`` for each workload asked: items.jsonl, manifest.json, prompts/*.txt.
``<workloads>`` is ``$PROMPTLOOKUP_WORKLOADS``, else ``~/.cache/promptlookup/workloads``. The same
seed and the same pins give the same files, byte for byte.

    python benchmarks/workloads/real/build.py [--only fast_apply,summaries,agents] [--seed 0]
        [--fast-apply-n 30] [--summaries-n 24] [--agents-per-category 12]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/workloads: the `real` package

from real import agents, fast_apply, sources, summaries  # noqa: E402
from real.common import WorkloadError, workloads_root, write_workload  # noqa: E402

NAMES = ("fast_apply", "summaries", "agents")


def build_one(name: str, root: Path, args: argparse.Namespace) -> Path:
    out = root / "real"
    if name == "fast_apply":
        pairs = sources.fetch_sdists(root)
        items, settings = fast_apply.build(pairs, sources.RELEASES, args.fast_apply_n, args.seed)
        sizes = [{"id": it["id"], **it["meta"]} for it in items]
    elif name == "summaries":
        site = sources.prepare_site(root)
        items, settings = summaries.build(site / "aclsum" / "dataset", args.summaries_n, args.seed)
        sizes = [{"id": it["id"], **it["meta"]} for it in items]
    else:
        site = sources.prepare_site(root)
        items, settings = agents.build(site / "bfcl_eval", args.agents_per_category, args.seed)
        settings["site"] = str(site)
        sizes = [{"id": it["id"], **it["meta"]} for it in items]
    return write_workload(out, name, items, settings, sizes)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(NAMES), help=f"comma-separated, of {', '.join(NAMES)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fast-apply-n", type=int, default=30)
    ap.add_argument("--summaries-n", type=int, default=24)
    ap.add_argument("--agents-per-category", type=int, default=12)
    ap.add_argument("--root", type=Path, default=None, help="the workloads cache (default: see above)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in NAMES]
    if bad or not names:
        ap.error(f"--only: unknown workload {bad[0] if bad else '(none)'!r} (known: {', '.join(NAMES)})")
    root = args.root or workloads_root()
    try:
        for name in names:
            folder = build_one(name, root, args)
            count = sum(1 for _ in (folder / "items.jsonl").open(encoding="utf-8"))
            print(f"{name}: {count} items in {folder}")
    except WorkloadError as exc:
        print(f"build: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
