"""The manifest contract (beside every artifact: `x.manifest.json`, `folder/manifest.json`, a
download's `NAME.manifest.json`; written by artifacts.write_manifest).

{"stage", "created", "params", "inputs": {name: {path, sha256 | bytes}}, "stats", "versions", ...}:
what produced the artifact, from which inputs (with their checksums), with which libraries. A
folder input has no sha256: an encoder's (embeddings, mined negatives, dense runs) carries
`weights`, its weight files' sha256 as the encoder's own manifest records them (stats.weights),
where it records them (encode.record_encoder_weights; not a staged checkpoint's).
"""
