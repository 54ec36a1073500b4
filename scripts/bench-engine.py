#!/usr/bin/env python3
"""The crate's own cost per call, today's engine against the last release's, in one run.

Builds `cargo bench --bench engine` twice with the release profile: from this checkout, and
from a git worktree of the last release's commit (`ci/semver/baseline`'s `release` line) with
today's `benches/engine.rs` and `Cargo.lock` copied in, so that both measure with the same
code, the same bare SDK requests, the same client configuration and the same dependencies. Then runs the two binaries alternately
(`--runs` each, the order flipped every round so that neither always runs warm or second) and
prints, for each figure, the median over the runs with a 95 % confidence interval of that
median (order statistics, distribution-free), and whether the two versions differ by more
than the noise (their intervals do not overlap).

Each binary interleaves the bare SDK requests with the crate's sample by sample, and its
`own_cost_*` figures are medians of those paired differences: the server's and the machine's
drift cancel inside a run, and the runs' spread is what the interval shows.

Usage: scripts/bench-engine.py [--runs N] [--release-commit COMMIT]
Honours CARGO_TARGET_DIR (default: the checkout's target/, shared by both builds) and
DYNAMODB_ENDPOINT (default: the embedded server, started by each run).
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIGURES = {
    "derive": "key + fingerprint",
    "memory_first": "memory store: first execution",
    "memory_duplicate": "memory store: duplicate",
    "own_cost_first": "own cost over the bare SDK: first execution",
    "own_cost_duplicate": "own cost over the bare SDK: duplicate",
    "cached_duplicate": "DynamoDB + in-process cache: duplicate",
    "cached_duplicate_back_to_back": "DynamoDB + in-process cache: duplicates back to back",
    "allocations_derive": "allocations: key + fingerprint",
    "allocations_memory_first": "allocations: memory store, first execution",
    "allocations_memory_duplicate": "allocations: memory store, duplicate",
    "allocations_own_first": "allocations over the bare SDK: first execution",
    "allocations_own_duplicate": "allocations over the bare SDK: duplicate",
    "allocations_cached_duplicate": "allocations: DynamoDB + cache, duplicate",
}


def release_commit() -> tuple[str, str]:
    """The last release's version and commit, as ci/semver/baseline names them."""
    for line in (REPO / "ci/semver/baseline").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "release":
            return parts[1], parts[2]
    sys.exit("ci/semver/baseline names no `release VERSION COMMIT` line")


def build(checkout: Path, target_dir: Path, locked: bool) -> Path:
    """Builds the engine bench in `checkout`; the path of its binary."""
    command = [
        "cargo", "bench", "--bench", "engine", "--no-run",
        "--message-format=json-render-diagnostics",
    ] + (["--locked"] if locked else [])
    env = dict(os.environ, CARGO_TARGET_DIR=str(target_dir))
    done = subprocess.run(command, cwd=checkout, env=env, check=True,
                          stdout=subprocess.PIPE, text=True)
    for line in done.stdout.splitlines():
        message = json.loads(line)
        if (message.get("reason") == "compiler-artifact"
                and message["target"]["name"] == "engine"
                and message.get("executable")):
            return Path(message["executable"])
    sys.exit(f"cargo built no engine bench in {checkout}")


def run(binary: Path) -> dict[str, float]:
    """One run of a bench binary: its `figure NAME MICROSECONDS` lines."""
    done = subprocess.run([str(binary), "--bench"], cwd=REPO, check=True,
                          stdout=subprocess.PIPE, text=True)
    figures = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "figure":
            figures[parts[1]] = float(parts[2])
    missing = set(FIGURES) - set(figures)
    if missing:
        sys.exit(f"{binary} printed no figure for {sorted(missing)}")
    return figures


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """The median of `values` and a distribution-free 95 % interval for it: the order
    statistics x(k), x(n-k+1) with the largest k for which P(Binomial(n, 1/2) < k) <= 2.5 %
    (for fewer than 6 values no such k exists, and the interval is the whole range)."""
    ordered = sorted(values)
    n = len(ordered)
    middle = n // 2
    median = ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    k, below = 1, 0.0
    while True:
        below += math.comb(n, k - 1) / 2**n
        if below > 0.025 or k > n // 2:
            break
        k += 1
    k = max(k - 1, 1)
    return median, ordered[k - 1], ordered[n - k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="runs of each version (default 8)")
    parser.add_argument("--release-commit", help="another baseline commit than the release's")
    args = parser.parse_args()
    version, commit = release_commit()
    if args.release_commit:
        version, commit = args.release_commit[:10], args.release_commit
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))

    worktree = Path(tempfile.mkdtemp(prefix="bench-engine-release."))
    try:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach",
                        str(worktree / "checkout"), commit], check=True,
                       stdout=subprocess.DEVNULL)
        release_checkout = worktree / "checkout"
        shutil.copy(REPO / "benches/engine.rs", release_checkout / "benches/engine.rs")
        # Today's dependency versions too, where the release's manifest admits them (cargo
        # changes only what it must): the comparison is of the crate's code, not the SDK's.
        shutil.copy(REPO / "Cargo.lock", release_checkout / "Cargo.lock")
        binaries = {
            version: build(release_checkout, target_dir, locked=False),
            "today": build(REPO, target_dir, locked=True),
        }
        runs: dict[str, list[dict[str, float]]] = {label: [] for label in binaries}
        for round_ in range(args.runs):
            order = list(binaries) if round_ % 2 == 0 else list(reversed(binaries))
            for label in order:
                runs[label].append(run(binaries[label]))
                print(f"run {round_ + 1}/{args.runs} {label}: "
                      + ", ".join(f"{name} {value:.1f}" for name, value in runs[label][-1].items()),
                      file=sys.stderr)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                        str(worktree / "checkout")], check=False)
        shutil.rmtree(worktree, ignore_errors=True)

    print(f"\nmedians over {args.runs} runs each (µs, or allocations per call), 95 % interval"
          " of the median in brackets\n")
    print(f"| figure | {version} | today | today − {version} |")
    print("|---|---|---|---|")
    for name, description in FIGURES.items():
        cells, intervals = [], []
        for label in binaries:
            median, low, high = median_interval([figures[name] for figures in runs[label]])
            cells.append(f"{median:.1f} [{low:.1f}, {high:.1f}]")
            intervals.append((median, low, high))
        (old, old_low, old_high), (new, new_low, new_high) = intervals
        overlap = new_low <= old_high and old_low <= new_high
        verdict = "within noise" if overlap else f"{new - old:+.1f}"
        print(f"| {description} | {cells[0]} | {cells[1]} | {verdict} |")


if __name__ == "__main__":
    main()
