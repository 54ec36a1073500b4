#!/usr/bin/env bash
# The local loop with the real emulator, end to end: the functions' tables on a local server
# (examples/local_stack), moto's SQS for the outbox relay to publish to, `cargo lambda watch`
# serving every function as Lambda's Runtime API would, and `cargo lambda invoke` sending each
# committed sample event twice (functions/events: direct, SQS, EventBridge, the HTTP API
# through axum, the checkout, a DynamoDB Streams record for the relay) and the stuck check's
# schedule event once. The duplicate must get the first answer (HTTP: the stored response,
# marked replayed), the relayed event must reach the queue once, the stuck check must find
# nothing stuck, and `idemctl stats` must show each operation recorded once, COMPLETED. Run by .ci/run; by hand it needs
# cargo-lambda (the pinned venv scripts/sam-build.sh installs in $SAM_VENV: ci/python/sam).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lambda-idempotency/target}"
sam_venv="${SAM_VENV:-$HOME/.cache/lambda-idempotency/venv-sam}"
moto_venv="${MOTO_VENV:-$HOME/.cache/lambda-idempotency/venv-moto}"
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
# The producers' and the relay's allow-list: the checkout's queue, and the one the stream
# record in functions/events/dynamodb_stream.json names (moto's, below).
export OUTBOX_DESTINATIONS="$ORDER_EVENTS_QUEUE_URL http://127.0.0.1:18001/123456789012/order-events"
export AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test

# moto's SQS, for the outbox relay to publish the checkout's event to (and for us to read back).
scripts/python-venv.sh "$moto_venv" ci/python/moto/requirements.txt
# functions/events/dynamodb_stream.json names the queue on this port.
moto_port=18001
"$moto_venv/bin/moto_server" -p "$moto_port" > "$work/moto.log" 2>&1 &
pids+=($!)
export AWS_ENDPOINT_URL_SQS="http://127.0.0.1:$moto_port"
sqs() {
  "$moto_venv/bin/python" -c "import boto3; q = boto3.client('sqs', endpoint_url='$AWS_ENDPOINT_URL_SQS', region_name='us-east-1', aws_access_key_id='test', aws_secret_access_key='test'); $1"
}
for _ in $(seq 100); do
  sqs "q.create_queue(QueueName='order-events')" 2>/dev/null && break
  sleep 0.2
done
sqs "q.get_queue_url(QueueName='order-events')" > /dev/null || { cat "$work/moto.log" >&2; exit 1; }

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
# The stream record's item, as the checkout's commit left it (the stream is not wired here):
# the relay reads its mark before it publishes, and marks it.
"$moto_venv/bin/python" - "$DYNAMODB_ENDPOINT" <<'PY'
import json, sys, boto3
db = boto3.client("dynamodb", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
record = json.load(open("functions/events/dynamodb_stream.json"))["Records"][0]
db.put_item(TableName="local-outbox", Item=record["dynamodb"]["NewImage"])
PY
check_twice outbox_relay dynamodb_stream
invoke stuck_check schedule > "$work/stuck.json"
invoke outbox_sweeper schedule > "$work/sweeper.json"

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def answers(function):
    with open(f"{work}/{function}.answers") as lines:
        return [json.loads(line) for line in lines if line.strip()]
for function in ["quickstart", "sqs_orders", "eventbridge_handler", "checkout", "outbox_relay"]:
    first, second = answers(function)
    assert first == second, f"{function}: the duplicate was answered {second}, not {first}"
first, second = answers("api_payments")
assert first["statusCode"] == second["statusCode"] and first["body"] == second["body"], (first, second)
headers = {name.lower(): value for name, value in second.get("headers", {}).items()}
assert headers.get("idempotent-replayed") == "true", f"the retried payment is not marked replayed: {second}"
assert answers("sqs_orders")[0] == {"batchItemFailures": []}, answers("sqs_orders")
assert answers("outbox_relay")[0] == {"batchItemFailures": []}, answers("outbox_relay")
print("every duplicate got the first answer")
with open(f"{work}/stuck.json") as stuck:
    gauges = json.load(stuck)
for gauge in ["StuckInProgress", "Indeterminate", "OrphanedEvidence", "StuckCheckIncomplete"]:
    assert gauges[gauge] == 0, f"the stuck check reports {gauge} = {gauges[gauge]}: {gauges}"
print("the stuck check finds nothing stuck")
with open(f"{work}/sweeper.json") as sweeper:
    gauges = json.load(sweeper)
# The checkout's own event waits for the relay (the stream is not wired here): pending, not
# yet past the sweeper's ten minutes; nothing failed or parked.
for gauge in ["OutboxRepublished", "OutboxSweepFailed", "OutboxParkedEvents"]:
    assert gauges[gauge] == 0, f"the sweeper reports {gauge} = {gauges[gauge]}: {gauges}"
print(f"the sweeper: nothing to republish, the oldest pending event {gauges['OutboxOldestPendingAge']} s old")
PY

echo "== the relayed event, published once"
sqs "m = q.receive_message(QueueUrl=q.get_queue_url(QueueName='order-events')['QueueUrl'], MaxNumberOfMessages=10, WaitTimeSeconds=1).get('Messages', []); print(len(m)); assert len(m) == 1, m; assert '6d1f0c3a' in m[0]['Body'], m"

echo "== the ledger: each operation once"
"$CARGO_TARGET_DIR/debug/idemctl" stats --json | tee "$work/stats.json"
python3 - "$work/stats.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert all(row["status"] == "COMPLETED" for row in rows), f"not all completed: {rows}"
# quickstart 1, sqs_orders 2 (two messages), eventbridge_handler 1, api_payments 1,
# checkout 1 (the outbox relay keeps no records: its marks are in the outbox table)
total = sum(row["count"] for row in rows)
assert total == 6, f"{total} records for 6 operations sent twice each: {rows}"
print(f"{total} operations, each recorded once and COMPLETED")
PY
