#!/usr/bin/env bash
# The README's first command: sets up .venv (as tools/setup.sh) and runs the demo,
# a small CNN with BatchNorm on scikit-learn's digits under Lightning with apex-O2 +
# apex-ddp on 2 processes, against plain Lightning. Arguments go to the demo
# (e.g. --epochs 5 --plot loss.png).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python plugins/lightning/examples/digits.py "$@"
