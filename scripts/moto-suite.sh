#!/usr/bin/env bash
# A second opinion on DynamoDB semantics: the integration suite against moto's server instead
# of the embedded one. moto applies a conditional write as a read then a write, which
# concurrent requests can interleave; scripts/moto_locked.py serialises its requests so that
# each write is atomic, as DynamoDB's are.
#
# What runs smaller there: moto ignores a transaction's ClientRequestToken (the endpoint is
# probed for it), so a re-sent transaction is applied again instead of being answered as
# committed, and the DynamoDB simulation runs without its transactional handlers. Expired records
# are deleted by the suite's own sweep (a scan and delete on the test's clock), since moto
# has no TTL deletion.
#
#   scripts/moto-suite.sh [extra arguments for the test binary, e.g. a test name filter]
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lambda-idempotency/target}"
venv="${MOTO_VENV:-$HOME/.cache/lambda-idempotency/venv-moto}"
scripts/python-venv.sh "$venv" ci/python/moto/requirements.txt
port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp)"
"$venv/bin/python" scripts/moto_locked.py "$port" > "$log" 2>&1 &
moto=$!
trap 'kill "$moto" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  grep -q "Running on" "$log" && break
  sleep 0.1
done
grep -q "Running on" "$log" || { cat "$log" >&2; exit 1; }

echo "== cargo test --all-features --test integration, against moto $("$venv/bin/pip" show moto | sed -n 's/^Version: //p') on port $port"
DYNAMODB_ENDPOINT="http://127.0.0.1:$port" AWS_REGION=us-east-1 \
  cargo test --all-features --test integration -- --test-threads 4 "$@"
