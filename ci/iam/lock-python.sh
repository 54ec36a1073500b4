#!/usr/bin/env bash
# Regenerates requirements.txt from requirements.in (every package pinned, with the hashes of
# its wheels for CPython 3.11 on manylinux x86_64 and aarch64): ci/python/lock.sh, which locks
# every Python tool set CI installs, on this directory. Run it after changing requirements.in;
# commit both.
set -euo pipefail
exec "$(dirname "$0")/../python/lock.sh" "$(dirname "$0")"
