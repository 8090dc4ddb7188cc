#!/usr/bin/env bash
# Sets up everything and runs attnx's main job: train the sentiment model on the UCI review
# sentences (amazon + yelp) and print its validation accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
shared_data="$(cd .. && pwd)/shared/data"
if [ -z "${ATTNX_DATA_DIR:-}" ] && [ -d "$shared_data" ]; then export ATTNX_DATA_DIR="$shared_data"; fi
cd examples && python3 sentiment.py "$@"
