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


def test_no_top_level_name_is_defined_in_two_rule_files():
    """Every rule file runs in the Snakefile's one namespace: a function or constant defined in two
    files is silently replaced by the one included last (a `corpus_arguments` in the dataset rules
    once replaced chunking's, and no target that needed chunks could be planned)."""
    import re
    from collections import defaultdict

    defined = defaultdict(set)
    for path in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]:
        for line in path.read_text().splitlines():
            match = re.match(r"(?:def\s+(\w+)\s*\(|(\w+)\s*(?::[^=]*)?=(?!=))", line)
            if match:
                defined[match.group(1) or match.group(2)].add(path.name)
    twice = {name: sorted(files) for name, files in defined.items() if len(files) > 1}
    assert not twice, f"defined in more than one rule file: {twice}"
