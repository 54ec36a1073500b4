#!/usr/bin/env bash
# Makes VENV a venv holding exactly what REQUIREMENTS (a requirements.txt that ci/python/lock.sh
# made) pins: `pip install --require-hashes --only-binary :all: --no-deps`, so pip installs only
# wheels whose sha256 the file lists and nothing it does not name, then `pip check` confirms
# that the pins are complete. VENV is deleted and re-created whenever the file's sha256
# differs from the one its last install recorded (VENV/.requirements.sha256), so point it only
# at a venv of its own; otherwise this prints nothing and takes milliseconds.
#
#   scripts/python-venv.sh VENV REQUIREMENTS
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 VENV REQUIREMENTS" >&2; exit 2; }
venv=$1
requirements=$2
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
[ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ] || exit 0
# The locks hold CPython 3.11's wheels (ci/python/lock.sh).
python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
  echo "python3 is $(python3 --version 2>&1): $requirements pins CPython 3.11 wheels (re-lock with ci/python/lock.sh under another)" >&2
  exit 1
}
echo "== installing $requirements (pinned, with hashes) into $venv"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --require-hashes \
  --only-binary :all: --no-deps -r "$requirements"
"$venv/bin/pip" check --disable-pip-version-check >/dev/null || {
  "$venv/bin/pip" check --disable-pip-version-check >&2
  exit 1
}
echo "$want" > "$venv/.requirements.sha256"
