#!/usr/bin/env bash
# The CDK app (deploy/cdk): `cdk synth` with its functions bundled by the local cargo-lambda
# (RustFunction, no Docker), then the synthesised template evaluated by the IAM check
# (ci/iam/evaluate.mjs, as template.yaml is): every recorded request of the app's eight
# functions (each must have some) is allowed; the prime read outside the function's namespace
# and every request of template.yaml's deny set (ci/iam/deny.json) are refused. (outbox_marker,
# the Pipe path's, is template.yaml's only.)
#
#   scripts/cdk-synth.sh [RECORDINGS_DIR]
#
# RECORDINGS_DIR: the functions' tests' recordings ($CARGO_TARGET_DIR/tmp/iam-requests by
# default; scripts/iam-check.sh's). Needs node and npm (the app's packages are pinned in
# deploy/cdk/package-lock.json), cargo-lambda and zig (the SAM venv: ci/python/sam), and the
# IAM check's venv (scripts/iam-check.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lambda-idempotency/target}"
recordings="${1:-$CARGO_TARGET_DIR/tmp/iam-requests}"
sam_venv="${SAM_VENV:-$HOME/.cache/lambda-idempotency/venv-sam}"
iam_python="${IAM_VENV:-$HOME/.cache/lambda-idempotency/venv-iam}/bin/python"
scripts/python-venv.sh "$sam_venv" ci/python/sam/requirements.txt
export PATH="$sam_venv/bin:$PATH"

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "== npm ci (deploy/cdk)"
(cd deploy/cdk && npm ci --no-audit --no-fund --loglevel=error)

echo "== cdk synth (RustFunction bundles through cargo lambda build)"
(cd deploy/cdk && npx cdk synth --quiet -o "$out/cdk.out")
template="$out/cdk.out/LambdaIdempotencyExample.template.json"
test -s "$template"

echo "== the IAM check on the synthesised template"
mkdir -p "$out/requests"
"$iam_python" - "$template" "$recordings" "$out/requests" <<'PY'
import collections, json, pathlib, sys
template = json.load(open(sys.argv[1]))
source, target = pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
# The app's functions, by the binary each runs (the metadata the IAM check maps them by).
# (A function the CDK adds itself, such as a custom resource's provider, names none.)
binaries = {
    resource.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
    for resource in template["Resources"].values()
    if resource["Type"] == "AWS::Lambda::Function"
} - {None}
kept = collections.Counter()
for recording in sorted(source.glob("*.jsonl")):
    lines = [line for line in recording.open() if json.loads(line)["binary"] in binaries]
    if lines:
        (target / recording.name).write_text("".join(lines))
        kept.update(json.loads(line)["binary"] for line in lines)
unrecorded = sorted(binaries - set(kept))
if unrecorded:
    sys.exit(f"no recorded request of {unrecorded} in {source}: the check would cover nothing of them")
print(f"{sum(kept.values())} recorded requests of the app's {len(binaries)} functions: "
      + ", ".join(f"{binary} {count}" for binary, count in sorted(kept.items())))
PY
node ci/iam/evaluate.mjs --template "$template" --python "$iam_python" --expect allowed "$out/requests" | tail -n 3
node ci/iam/evaluate.mjs --template "$template" --python "$iam_python" --expect denied ci/iam/fixtures/prime-defect.jsonl | tail -n 1
# template.yaml's deny set: what no function may do (another namespace's keys, a payload read
# by the relay, a Scan, ...), refused by the app's policies as by the template's.
node ci/iam/evaluate.mjs --template "$template" --python "$iam_python" --deny-set ci/iam/deny.json | tail -n 1
echo "cdk synth: the app's template allows its functions' requests and refuses the prime defect and the deny set"
