#!/usr/bin/env bash
# Sets up everything and runs attnx's main job: train the sentiment model on the UCI review
# sentences (amazon + yelp) and print its validation accuracy: the mean over seeds 0-4 and each
# seed's (one run moves by a couple of points with the seed). Arguments go to examples/sentiment.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
shared_data="$(cd .. && pwd)/shared/data"
if [ -z "${ATTNX_DATA_DIR:-}" ] && [ -d "$shared_data" ]; then export ATTNX_DATA_DIR="$shared_data"; fi
if [ $# -eq 0 ]; then set -- --seeds 5 --verbose 0; fi
cd examples && python3 sentiment.py "$@"
