#!/usr/bin/env bash
# The checks `cargo test --all-features` runs at small sizes, at CI's sizes: the model check at
# its small bounds (MODEL_BOUNDS=small; the default run explores them with less time) in the
# optimised `checks` profile, and the seeded simulation's long run on both stores in the test
# build `cargo test` made (an optimised build of the integration suite costs more than it saves).
# Sizes and times: BENCHMARKS.md. Run it locally as CI does: scripts/exhaustive-checks.sh
set -euo pipefail
cd "$(dirname "$0")/.."

memory_seeds="${SIM_MEMORY_SEEDS:-3000}"
dynamodb_seeds="${SIM_DYNAMODB_SEEDS:-100}"

echo "== the model check at CI's bounds (MODEL_BOUNDS=small)"
started=$SECONDS
log="$(mktemp)"
# Each check prints its size; a found revert prints its trace, kept in the log.
if ! MODEL_BOUNDS=small cargo test --profile checks --all-features -p lambda-idempotency --lib model -- --nocapture \
  >"$log" 2>&1; then
  cat "$log"
  exit 1
fi
grep -E '^(model \(|test result)' "$log"
echo "the model check: $((SECONDS - started)) s, its build included"

shuttle_schedules="${SHUTTLE_SCHEDULES:-20000}"
relay_schedules="${SHUTTLE_RELAY_SCHEDULES:-600}"
echo "== the real engine under shuttle's scheduler: $shuttle_schedules random and $((shuttle_schedules / 2)) PCT schedules per scenario, $((relay_schedules * 3)) with the relay"
started=$SECONDS
# Each scenario prints what it explored; a failure prints shuttle's schedule, kept in the log.
if ! SHUTTLE_SCHEDULES="$shuttle_schedules" SHUTTLE_RELAY_SCHEDULES="$relay_schedules" cargo test --all-features -p lambda-idempotency \
  --test integration schedules:: -- --nocapture >"$log" 2>&1; then
  cat "$log"
  exit 1
fi
grep -E 'Explored|test result' "$log"
echo "the real engine's schedules: $((SECONDS - started)) s"

echo "== the seeded simulation: $memory_seeds seeds on the memory store"
started=$SECONDS
SIM_SEEDS="$memory_seeds" cargo test --all-features -p lambda-idempotency --test integration \
  simulation::simulation_keeps_the_invariants_on_the_memory_store

echo "the memory store's seeds: $((SECONDS - started)) s"

echo "== the seeded simulation: $dynamodb_seeds seeds on the memory store with its tables"
started=$SECONDS
SIM_SEEDS="$dynamodb_seeds" cargo test --all-features -p lambda-idempotency --test integration \
  simulation::simulation_keeps_the_invariants_on_the_transactional_memory_store
echo "the transactional memory store's seeds: $((SECONDS - started)) s"

echo "== the seeded simulation: $dynamodb_seeds seeds on the DynamoDB store"
started=$SECONDS
SIM_SEEDS="$dynamodb_seeds" cargo test --all-features -p lambda-idempotency --test integration \
  simulation::simulation_keeps_the_invariants_on_the_dynamodb_store
echo "the DynamoDB store's seeds: $((SECONDS - started)) s"
