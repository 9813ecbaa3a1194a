#!/usr/bin/env bash
# The README's first command: sets up .venv (as tools/setup.sh; quick once installed),
# builds core-ops' native kernels once (timed, apart from the demo's figures), then runs
# the demo: a small byte-level transformer on Python's standard library under Lightning,
# core-ops' apex-O2 + apex-ddp against plain Lightning's 32-true and bf16-mixed
# (16-mixed on a GPU). Arguments go to the demo (e.g. --steps 100 --plot out.png).
set -euo pipefail
here=$(pwd)
cd "$(dirname "$0")/.."
repo=$(pwd)
echo "setting up .venv (only the first time takes minutes)..."
bash tools/setup.sh > /tmp/core-ops-setup.log 2>&1 || { cat /tmp/core-ops-setup.log; exit 1; }
py="$repo/.venv/bin/python"
kinds=cpu
"$py" -c "import torch; raise SystemExit(0 if torch.cuda.is_available() else 1)" && kinds="cpu cuda"
for kind in $kinds; do
  if ! "$py" -c "from core_ops import native; raise SystemExit(0 if native.ensure('$kind', native.LOOK, warn=False).native else 1)"; then
    echo "building core-ops' $kind kernels (once; cached for later runs)..."
    start=$(date +%s)
    "$py" -m core_ops build $([ "$kind" = cuda ] && echo --cuda) > /tmp/core-ops-build.log 2>&1 \
      || { tail -n 20 /tmp/core-ops-build.log; exit 1; }
    echo "built in $(( $(date +%s) - start )) s (not counted in the figures below)"
  fi
done
# From the caller's folder, so that --plot out.png lands where the user is.
cd "$here"
exec "$py" "$repo/plugins/lightning/examples/char_lm.py" "$@"
