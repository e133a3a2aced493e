#!/usr/bin/env bash
# Run by Snakemake inside the new environment: Pyserini without its declared dependencies (its
# runtime set is pinned in pyserini.yaml), exactly as requirements-nodeps.txt installs it.
set -euo pipefail
pip install --no-deps pyserini==1.6.0
