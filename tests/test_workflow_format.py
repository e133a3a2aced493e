"""The Snakefile and rule files stay in snakefmt's format, and the workflow parses with every rule."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_rule_files_are_snakefmt_formatted():
    files = ["Snakefile", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "rules").glob("*.smk"))]
    result = subprocess.run(
        [sys.executable, "-m", "snakefmt", "--check", *files], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, f"run `snakefmt Snakefile rules/`:\n{result.stderr}"


def test_every_stage_rule_is_defined():
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--list-rules"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    rules = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    expected = {
        "download_dump_part", "extract_articles", "stage_checkpoint", "stage_tokenizer",
        "chunk_articles", "sample_spans",
        "pretrain_model", "export_base_encoder", "prepare_dataset", "build_bm25_index", "bm25_search",
        "bm25_negatives", "finetune_stage1", "encode_corpus_shard", "build_dense_index",
        "mine_hard_negatives", "finetune_stage2", "dense_search", "score_run", "make_tables",
    }
    assert expected <= rules, expected - rules
