"""Reading a dataset's source files: a malformed line is named with its file and line."""

import pytest

from retrieval_pretraining import dataset_files
from retrieval_pretraining.contracts.datasets import DatasetError


def test_ragged_tsv_lines_fail(tmp_path):
    path = tmp_path / "collection.tsv"
    path.write_text("0\tfine\n1\tone\ttoo many\n")
    with pytest.raises(
        DatasetError, match=r"collection.tsv, line 2: 3 tab-separated fields"
    ):
        list(dataset_files.read_corpus_tsv_batches(path))
