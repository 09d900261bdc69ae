"""``hpp scenarios`` and ``hpp profiles``: what hpp bundles (planning scenarios; model profiles and what each
covers), listed for a user to choose from (thin: :mod:`hpp.scenarios`, :mod:`hpp.profiles.coverage`)."""

from __future__ import annotations

import json
from pathlib import Path

from hpp.profiles.bundled import bundled_models, load_bundled_profile
from hpp.profiles.cluster_format import cluster_to_dict
from hpp.scenarios import DEFAULT_SCENARIO, SCENARIOS, get_scenario

__all__ = ["add_bundled_commands", "cmd_scenarios", "cmd_profiles"]


def cmd_scenarios(args) -> int:
    if args.cluster:   # the scenario's cluster as a cluster file, to edit or to plan with your own profile
        print(json.dumps(cluster_to_dict(get_scenario(args.cluster, field="--cluster").cluster()), indent=1))
        return 0

    rows = []
    for s in SCENARIOS.values():
        gpus = " + ".join(f"{n} {t}" for t, n in s.gpus)
        rows.append({"name": s.name, "model": s.model, "global_batch_size": s.global_batch_size, "cluster": gpus,
                     "default": s.name == DEFAULT_SCENARIO})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['name']:<24} {r['model']:<12} gbs {r['global_batch_size']:<5} {r['cluster']}"
              f"{'   (default)' if r['default'] else ''}")
    return 0


def cmd_profiles(args) -> int:
    from hpp.profiles.coverage import coverage_lines, coverage_to_dict, profile_coverage
    from hpp.profiles.profile_format import load_profile

    profiles = [load_profile(f) for f in args.files] if args.files else \
        [load_bundled_profile(m) for m in bundled_models()]
    cover = [profile_coverage(p) for p in profiles]
    if args.json:
        print(json.dumps({"profiles": [coverage_to_dict(c) for c in cover]}, indent=1))
        return 0
    for c in cover:
        print("\n".join(coverage_lines(c)))
    from hpp.profiles.devices import BUNDLED_DEVICE_TYPES
    print(f"A GPU type a profile does not list (any type outside the bundled "
          f"{', '.join(sorted(BUNDLED_DEVICE_TYPES))}, e.g. V100-32, is in none of them) has no measurement in it: "
          f"profile the model on that GPU (hpp profile --device cuda --out P.json) and plan with --profile P.json.")
    return 0


def add_bundled_commands(sub) -> None:
    """Add ``scenarios`` and ``profiles`` to the ``hpp`` parser's subcommands ``sub``."""
    s = sub.add_parser("scenarios", help="list the bundled scenarios")
    s.add_argument("--json", action="store_true")
    s.add_argument("--cluster", metavar="NAME", help="print scenario NAME's cluster as a cluster JSON file")
    s.set_defaults(func=cmd_scenarios)

    pr = sub.add_parser("profiles", help="what each bundled profile (or each FILE) covers: GPU types, TP degrees, "
                                         "micro-batch sizes, dtype, sequence length")
    pr.add_argument("files", nargs="*", type=Path, metavar="FILE", help="profile files (default: the bundled ones)")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_profiles)
