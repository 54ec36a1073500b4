#!/usr/bin/env bash
# The local loop with the real emulator, end to end: the functions' tables on a local server
# (examples/local_stack), `cargo lambda watch` serving every function as Lambda's Runtime API
# would, and `cargo lambda invoke` sending each committed sample event twice. The duplicate
# must get the first answer (HTTP: the stored response, marked replayed), and `idemctl stats`
# must show each operation recorded once, COMPLETED. Run by .ci/run; by hand it needs
# cargo-lambda (`pip install cargo-lambda`, or the venv scripts/sam-build.sh installs).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lambda-idempotency/target}"
sam_venv="${SAM_VENV:-$HOME/.cache/lambda-idempotency/venv-sam}"
export PATH="$sam_venv/bin:$PATH"
db_port="${LOCAL_LOOP_DB_PORT:-18000}"
invoke_port="${LOCAL_LOOP_INVOKE_PORT:-19000}"
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# Every binary the loop runs, built once up front (so that no wait below races a compile).
cargo build --quiet -p lambda-idempotency-functions --example local_stack --bins
cargo build --quiet --features cli --bin idemctl

echo "== the tables on 127.0.0.1:$db_port"
cargo run --quiet -p lambda-idempotency-functions --example local_stack -- --port "$db_port" \
  > "$work/stack.log" 2>&1 &
pids+=($!)
for _ in $(seq 120); do
  grep -q "tables ready" "$work/stack.log" && break
  sleep 0.5
done
grep -q "tables ready" "$work/stack.log" || { cat "$work/stack.log" >&2; exit 1; }
export DYNAMODB_ENDPOINT="http://127.0.0.1:$db_port"
export IDEMPOTENCY_TABLE=local-idempotency UNIQUENESS_TABLE=local-uniqueness LEDGER_TABLE=local-ledger
export OUTBOX_TABLE=local-outbox ORDER_EVENTS_QUEUE_URL=http://127.0.0.1/000000000000/order-events
export AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test

echo "== cargo lambda watch on port $invoke_port"
cargo lambda watch -p lambda-idempotency-functions --invoke-port "$invoke_port" --ignore-changes \
  > "$work/watch.log" 2>&1 &
pids+=($!)

# One answer, as one line of compact JSON.
invoke() {
  cargo lambda invoke "$1" --invoke-port "$invoke_port" --data-file "functions/events/$2.json" \
    --output-format json | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))'
}

# The emulator starts a function on its first invocation; wait until it answers at all.
for _ in $(seq 240); do
  if invoke quickstart direct > "$work/first-quickstart.json" 2> "$work/invoke.err"; then
    break
  fi
  sleep 0.5
done
test -s "$work/first-quickstart.json" || { cat "$work/invoke.err" "$work/watch.log" >&2; exit 1; }

check_twice() {
  local function=$1 event=$2 first second
  if [ -s "$work/first-$function.json" ]; then
    first=$(cat "$work/first-$function.json")
  else
    first=$(invoke "$function" "$event")
  fi
  second=$(invoke "$function" "$event")
  echo "$function: $first"
  echo "$function (again): $second"
  printf '%s\n%s\n' "$first" "$second" > "$work/$function.answers"
}

check_twice quickstart direct
check_twice sqs_orders sqs
check_twice eventbridge_handler eventbridge
check_twice api_payments http_api
check_twice checkout checkout

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def answers(function):
    with open(f"{work}/{function}.answers") as lines:
        return [json.loads(line) for line in lines if line.strip()]
for function in ["quickstart", "sqs_orders", "eventbridge_handler", "checkout"]:
    first, second = answers(function)
    assert first == second, f"{function}: the duplicate was answered {second}, not {first}"
first, second = answers("api_payments")
assert first["statusCode"] == second["statusCode"] and first["body"] == second["body"], (first, second)
headers = {name.lower(): value for name, value in second.get("headers", {}).items()}
assert headers.get("idempotent-replayed") == "true", f"the retried payment is not marked replayed: {second}"
assert answers("sqs_orders")[0] == {"batchItemFailures": []}, answers("sqs_orders")
print("every duplicate got the first answer")
PY

echo "== the ledger: each operation once"
"$CARGO_TARGET_DIR/debug/idemctl" stats --json | tee "$work/stats.json"
python3 - "$work/stats.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert all(row["status"] == "COMPLETED" for row in rows), f"not all completed: {rows}"
# quickstart 1, sqs_orders 2 (two messages), eventbridge_handler 1, api_payments 1, checkout 1
total = sum(row["count"] for row in rows)
assert total == 6, f"{total} records for 6 operations sent twice each: {rows}"
print(f"{total} operations, each recorded once and COMPLETED")
PY
