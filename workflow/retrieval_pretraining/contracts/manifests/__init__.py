"""The manifest contract (beside every artifact: `x.manifest.json`, `folder/manifest.json`, a
download's `NAME.manifest.json`; written by artifacts.write_manifest).

{"stage", "created", "params", "inputs": {name: {path, sha256 | bytes}}, "stats", "versions", ...}:
what produced the artifact, from which inputs (with their checksums), with which libraries.
"""
