#!/usr/bin/env bash
# Builds template.yaml's functions the way a deployment does: `sam validate --lint`, then
# `sam build --beta-features` (SAM's rust-cargolambda build method: `cargo lambda build
# --release --arm64 --bin <Binary>` in each function's CodeUri), then checks that every
# AWS::Serverless::Function in the template produced an arm64 `bootstrap`.
#
# Installs what it needs on first use: a Python venv with cargo-lambda, zig and the SAM CLI
# (pinned with hashes, ci/python/sam; about two minutes, no compiling) and the
# aarch64-unknown-linux-gnu standard library. A first run compiles the AWS SDK for arm64 in
# release (about 6 minutes on 2 cores); keep CARGO_TARGET_DIR warm (then it takes seconds to a
# few minutes). No Docker and no AWS account are needed.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${SAM_VENV:-$HOME/.cache/lambda-idempotency/venv-sam}"
scripts/python-venv.sh "$venv" ci/python/sam/requirements.txt
export PATH="$venv/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lambda-idempotency/target}"
export SAM_CLI_TELEMETRY=0

if command -v rustup >/dev/null; then
  rustup target add aarch64-unknown-linux-gnu >/dev/null
fi

echo "== $(sam --version), $(cargo lambda --version)"
echo "== sam validate --lint"
sam validate --lint

echo "== sam build --beta-features"
started=$(date +%s)
sam build --beta-features
echo "sam build took $(( $(date +%s) - started )) s"

echo "== an arm64 bootstrap for every function in template.yaml"
"$venv/bin/python" - <<'PY'
import os
import sys

from samcli.yamlhelper import yaml_parse

with open("template.yaml") as source:
    template = yaml_parse(source.read())
functions = [name for name, resource in template["Resources"].items()
             if resource["Type"] == "AWS::Serverless::Function"]
missing = []
for name in functions:
    path = os.path.join(".aws-sam", "build", name, "bootstrap")
    if not os.path.isfile(path):
        missing.append(f"{name}: no {path}")
        continue
    with open(path, "rb") as binary:
        header = binary.read(20)
    # ELF, 64-bit, little-endian; e_machine 183 is AArch64.
    machine = int.from_bytes(header[18:20], "little")
    if header[:4] != b"\x7fELF" or header[4] != 2 or machine != 183:
        missing.append(f"{name}: {path} is not an arm64 ELF executable")
        continue
    print(f"{name:<22} {path:<46} {os.path.getsize(path) / 1e6:5.1f} MB  ELF aarch64")
if missing:
    sys.exit("\n".join(missing))
print(f"{len(functions)} functions, {len(functions)} arm64 bootstraps")
PY
