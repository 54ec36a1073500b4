#!/usr/bin/env bash
# The IAM check (issue 28): every request the function binaries send must be allowed by the
# policies template.yaml gives them, every request of the deny set must be refused, and the
# check must catch a deliberately narrowed and a deliberately widened copy of the template.
# The same for the example policy of the guide's deploy page (docs/guide/deploy.md), on the
# store's requests (the idempotency and uniqueness tables).
# No Rust build: it reads recordings (JSON lines) and the template. ci/iam/README.md explains
# each part.
#
#   scripts/iam-check.sh [REQUESTS...]
#
# REQUESTS: *.jsonl files or directories of them. Default: the end-to-end tests' recordings
# ($CARGO_TARGET_DIR/tmp/iam-requests, else target/tmp/iam-requests, else target/iam-requests),
# if any, and the hand-written fixture ci/iam/fixtures/sample-requests.jsonl (which covers the
# functions the tests do not run).
#
# Installs what it needs on first use, from pinned versions: aws-sam-translator and its
# dependencies with hashes (ci/iam/requirements.txt) into $IAM_VENV (default
# ~/.cache/lambda-idempotency/venv-iam), and @cloud-copilot/iam-simulate from
# ci/iam/package-lock.json (npm ci).
set -euo pipefail
cd "$(dirname "$0")/.."
iam=ci/iam

echo "== the IAM check's tools (pinned)"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
venv="${IAM_VENV:-$HOME/.cache/lambda-idempotency/venv-iam}"
scripts/python-venv.sh "$venv" "$iam/requirements.txt"
export IAM_PYTHON="$venv/bin/python"
lock="$(sha256sum "$iam/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$iam/node_modules/.iam-check-lock.sha256" 2>/dev/null)" != "$lock" ]; then
  (cd "$iam" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$lock" > "$iam/node_modules/.iam-check-lock.sha256"
fi
echo "aws-sam-translator $("$IAM_PYTHON" -c 'import samtranslator; print(samtranslator.__version__)'), @cloud-copilot/iam-simulate $(node -p "require('./$iam/node_modules/@cloud-copilot/iam-simulate/package.json').version"), node $(node --version)"

requests=("$@")
if [ ${#requests[@]} -eq 0 ]; then
  for recorded in "${CARGO_TARGET_DIR:-target}/tmp/iam-requests" target/tmp/iam-requests target/iam-requests; do
    if compgen -G "$recorded/*.jsonl" >/dev/null; then
      requests+=("$recorded")
      break
    fi
  done
  [ ${#requests[@]} -gt 0 ] || echo "(no recordings found: the fixture alone)"
  requests+=("$iam/fixtures/sample-requests.jsonl")
fi

passed=0
failed=0
step() {
  local title=$1
  shift
  echo
  echo "== $title"
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "!! FAILED: $title"
  fi
}

step "unit tests of the request-to-authorization derivation" node --test "$iam/test/"
step "every recorded request is allowed (${requests[*]})" \
  node "$iam/evaluate.mjs" --expect allowed "${requests[@]}"
step "the defect issue 28 names: a prime read outside the function's namespace is refused" \
  node "$iam/evaluate.mjs" --expect denied "$iam/fixtures/prime-defect.jsonl"
step "the deny set is refused" node "$iam/evaluate.mjs" --deny-set "$iam/deny.json"
step "docs/guide/deploy.md's example policy allows the store's requests (${requests[*]})" \
  node "$iam/readme-check.mjs" --expect allowed "${requests[@]}"
step "docs/guide/deploy.md's example policy refuses its deny set" node "$iam/readme-check.mjs" --deny-set "$iam/readme-deny.json"
step "self-test: broken copies of the template are caught" node "$iam/selftest.mjs" "${requests[@]}"

echo
echo "iam-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
