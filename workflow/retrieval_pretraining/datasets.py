"""Retrieval datasets in one canonical Parquet form, from BEIR folders or MS MARCO files.

Every later stage (BM25, fine-tuning, mining, retrieval, scoring) reads only:

    results/datasets/{dataset}/corpus.parquet        doc_id string, title string, text string
    results/datasets/{dataset}/queries-{split}.parquet   query_id string, text string
    results/datasets/{dataset}/qrels-{split}.parquet     query_id string, doc_id string, relevance int32
    results/datasets/{dataset}/dataset.json          title mode, query-id rule, splits, corpus quirks

Title and text stay separate in corpus.parquet; `join_title` (and `joined_text_expr` for polars)
builds the text a model or BM25 consumes, so the representation is a config choice, not baked in.

Quirks are counted (corpus: dataset.json; split: the queries/qrels manifests), never silently fixed:
- query ids equal to document ids (BEIR reuses ids; Anserini's `-removeQuery` excludes the query's
  own id from its ranking: `exclude_query_id` records whether downstream search must do the same),
- qrels naming documents missing from the corpus (kept: they count as unretrievable relevants, as
  the official evaluation does), qrels naming unknown queries (dropped, counted),
- empty document texts / titles and empty queries (kept, counted).
A split's queries are those that appear in its qrels (BEIR's convention; MS MARCO's 808k train
queries include ~300k without any judgement, useless for training and evaluation).

MS MARCO collections (22 GB of documents) are streamed: read in batches of lines, written batch by
batch into corpus.parquet (one row group per batch), counted on the way; unique ids are checked on
the doc_id column read back, so memory holds one batch, the ids (and the passage titles), never
the corpus.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import tarfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import artifacts
from .config import resolve_path, stage_parser

log = logging.getLogger(__name__)

CORPUS_SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
QUERIES_SCHEMA = pa.schema([("query_id", pa.string()), ("text", pa.string())])
QRELS_SCHEMA = pa.schema(
    [("query_id", pa.string()), ("doc_id", pa.string()), ("relevance", pa.int32())]
)

TITLE_MODES = ("none", "sep", "space")
DOWNLOAD_DIR = "results/downloads/datasets"
# A corpus batch ends at this many documents or characters (MS MARCO documents average ~7k).
CORPUS_BATCH_ROWS = 100_000
CORPUS_BATCH_CHARS = 128 << 20


class DatasetError(ValueError):
    """An input file is malformed (the message names the file, the line and the fix)."""


# --- the text a model consumes --------------------------------------------------------------


def join_title(title: str | None, text: str | None, mode: str, sep_token: str = "[SEP]") -> str:
    """The document representation: `none` = text, `sep` = `title [SEP] text`, `space` = `title text`.

    An empty title gives the text alone in every mode (no dangling separator).
    """
    if mode not in TITLE_MODES:
        raise ValueError(f"title mode {mode!r} unknown; use one of {', '.join(TITLE_MODES)}")
    title, text = title or "", text or ""
    if mode == "none" or not title:
        return text
    if mode == "sep":
        return f"{title} {sep_token} {text}"
    return f"{title} {text}"


def joined_text_expr(mode: str, sep_token: str = "[SEP]") -> pl.Expr:
    """`join_title` as a polars expression over the corpus columns `title` and `text`."""
    if mode not in TITLE_MODES:
        raise ValueError(f"title mode {mode!r} unknown; use one of {', '.join(TITLE_MODES)}")
    text = pl.col("text").fill_null("")
    title = pl.col("title").fill_null("")
    if mode == "none":
        return text.alias("text")
    glue = f" {sep_token} " if mode == "sep" else " "
    return pl.when(title == "").then(text).otherwise(title + glue + text).alias("text")


def dataset_dir(root: str | os.PathLike, dataset: str) -> Path:
    return Path(root) / dataset


def read_info(folder: str | os.PathLike) -> dict[str, Any]:
    """dataset.json of a prepared dataset: title mode, exclude_query_id, splits, quirks."""
    return artifacts.read_json(Path(folder) / "dataset.json")


def read_qrels(path: str | os.PathLike, min_relevance: int = 1) -> dict[str, set[str]]:
    """{query_id: {doc_id, ...}} of the judgements with relevance >= min_relevance."""
    frame = pl.read_parquet(path).filter(pl.col("relevance") >= min_relevance)
    grouped = frame.group_by("query_id").agg(pl.col("doc_id"))
    return {q: set(docs) for q, docs in grouped.iter_rows()}


# --- reading input files ----------------------------------------------------------------------


@contextmanager
def open_text(path: Path, member: str | None = None) -> Iterator[io.TextIOBase]:
    """A text stream over `path` (plain or .gz), or over `member` inside a tar archive."""
    if member is not None:
        with tarfile.open(path, "r:*") as archive:
            try:
                handle = archive.extractfile(member)
            except KeyError:
                names = ", ".join(archive.getnames()[:20])
                raise DatasetError(
                    f"{path}: no member {member!r} in the archive (it holds: {names}); "
                    "fix `member` in the dataset config"
                ) from None
            if handle is None:
                raise DatasetError(f"{path}: member {member!r} is not a regular file")
            raw = gzip.GzipFile(fileobj=handle) if member.endswith(".gz") else handle
            yield io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
        return
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8", newline="\n") as handle:
            yield handle
    else:
        with open(path, encoding="utf-8", newline="\n") as handle:
            yield handle


def _where(path: Path, member: str | None) -> str:
    return f"{path}!{member}" if member else str(path)


def read_jsonl(
    path: Path, fields: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, list]:
    """Columns `fields` (+ `optional`, default "") of a JSON-lines file; ids are read as strings."""
    columns: dict[str, list] = {f: [] for f in fields + optional}
    with open_text(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DatasetError(f"{path}, line {number}: not valid JSON ({error})") from None
            for field in fields:
                if field not in record:
                    raise DatasetError(
                        f"{path}, line {number}: missing field {field!r}; BEIR files need "
                        f"{', '.join(fields)}"
                    )
                columns[field].append(str(record[field]) if field == "_id" else record[field])
            for field in optional:
                columns[field].append(record.get(field) or "")
    return columns


def read_tsv_records(
    path: Path, member: str | None, widths: tuple[int, ...]
) -> Iterator[list[str]]:
    """Tab-separated records of one of the allowed field counts (a bad line fails, naming it)."""
    with open_text(path, member) as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) not in widths:
                raise DatasetError(
                    f"{_where(path, member)}, line {number}: {len(fields)} tab-separated fields, "
                    f"expected {' or '.join(map(str, widths))}"
                )
            yield fields


def read_qrels_file(path: Path, member: str | None = None) -> pl.DataFrame:
    """Qrels in TREC format (`qid iter docid rel`, spaces or tabs) or BEIR's 3-column TSV with header."""
    qids, dids, rels = [], [], []
    with open_text(path, member) as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split()
            if not fields:
                continue
            if number == 1 and fields[0] == "query-id":
                continue  # BEIR header
            if len(fields) == 4:
                qid, _, did, rel = fields
            elif len(fields) == 3:
                qid, did, rel = fields
            else:
                raise DatasetError(
                    f"{_where(path, member)}, line {number}: {len(fields)} fields; qrels lines are "
                    "`query_id iteration doc_id relevance` (TREC) or `query-id corpus-id score` (BEIR)"
                )
            try:
                rels.append(int(rel))
            except ValueError:
                raise DatasetError(
                    f"{_where(path, member)}, line {number}: relevance {rel!r} is not an integer"
                ) from None
            qids.append(qid)
            dids.append(did)
    return pl.DataFrame(
        {"query_id": qids, "doc_id": dids, "relevance": rels},
        schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32},
    )


def read_queries_tsv(path: Path, member: str | None = None) -> pl.DataFrame:
    rows = list(read_tsv_records(path, member, (2,)))
    return pl.DataFrame(rows, schema={"query_id": pl.String, "text": pl.String}, orient="row")


def read_corpus_tsv_batches(
    path: Path, member: str | None = None, rows: int | None = None, chars: int | None = None
) -> Iterator[pl.DataFrame]:
    """MS MARCO passage (`pid text`) or document (`docid url title body`) collections, plain, .gz
    or a tar member, as (doc_id, title, text) frames of at most `rows` documents or `chars`
    characters (CORPUS_BATCH_ROWS / CORPUS_BATCH_CHARS by default)."""
    rows = rows or CORPUS_BATCH_ROWS
    chars = chars or CORPUS_BATCH_CHARS
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    size = 0

    def flush() -> pl.DataFrame:
        frame = pl.DataFrame(
            {"doc_id": ids, "title": titles, "text": texts},
            schema={"doc_id": pl.String, "title": pl.String, "text": pl.String},
        )
        for column in (ids, titles, texts):
            column.clear()
        return frame

    for fields in read_tsv_records(path, member, (2, 4)):
        ids.append(fields[0])
        titles.append("" if len(fields) == 2 else fields[2])
        texts.append(fields[-1])
        size += len(fields[-1]) + len(titles[-1])
        if len(ids) >= rows or size >= chars:
            yield flush()
            size = 0
    if ids:
        yield flush()


# --- loading a dataset: the corpus, then each split -----------------------------------------


def resolve_ref(
    ref: dict[str, Any], entry: dict[str, Any], data_root: str | None, downloads: Path | None = None
) -> tuple[Path, str | None]:
    """A file reference of the config: `{path: ...}` or `{download: <file>, member: <in archive>}`.

    Downloads lie in `downloads` (default: results/downloads/datasets/<dataset>/ of the project).
    """
    if "path" in ref:
        return resolve_path(ref["path"], data_root), ref.get("member")
    folder = Path(downloads) if downloads else Path(DOWNLOAD_DIR) / entry["name"]
    return resolve_path(folder / ref["download"], data_root), ref.get("member")


def _split_entry(entry: dict[str, Any], split: str) -> dict[str, Any]:
    for candidate in entry["splits"]:
        if candidate["name"] == split:
            return candidate
    names = ", ".join(s["name"] for s in entry["splits"])
    raise DatasetError(
        f"dataset {entry['name']!r} has no split {split!r} (splits: {names}); fix `splits`"
    )


def corpus_batches(
    entry: dict[str, Any], data_root: str | None, downloads: Path | None = None
) -> tuple[Iterator[pl.DataFrame], dict[str, Path]]:
    """The corpus as (doc_id, title, text) batches in file order, and the files it is read from.

    BEIR corpora are read whole (they are small) and sliced; MS MARCO collections are streamed.
    """
    if entry["format"] == "beir":
        folder = resolve_path(entry["path"], data_root)
        cols = read_jsonl(folder / "corpus.jsonl", ("_id", "text"), optional=("title",))
        corpus = pl.DataFrame({"doc_id": cols["_id"], "title": cols["title"], "text": cols["text"]})
        return corpus.iter_slices(CORPUS_BATCH_ROWS), {"corpus": folder / "corpus.jsonl"}
    path, member = resolve_ref(entry["corpus"], entry, data_root, downloads)
    inputs = {"corpus": path}
    if not entry.get("titles"):
        return read_corpus_tsv_batches(path, member), inputs
    # RocketQA's para.title.txt (`pid <tab> title`): the passage titles the COSTA authors used.
    tpath, tmember = resolve_ref(entry["titles"], entry, data_root, downloads)
    titles = _read_titles(tpath, tmember)
    inputs["titles"] = tpath
    batches = (
        batch.join(titles, on="doc_id", how="left", maintain_order="left")
        .with_columns(pl.coalesce(pl.col("new_title"), pl.col("title")).alias("title"))
        .drop("new_title")
        for batch in read_corpus_tsv_batches(path, member)
    )
    return batches, inputs


def load_split(
    entry: dict[str, Any], split: str, data_root: str | None, downloads: Path | None = None
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Path]]:
    """(queries, qrels, input files) of one split, as read (not yet checked)."""
    if entry["format"] == "beir":
        _split_entry(entry, split)
        folder = resolve_path(entry["path"], data_root)
        qrels_path = folder / "qrels" / f"{split}.tsv"
        if not qrels_path.is_file():
            raise DatasetError(
                f"{qrels_path} does not exist; BEIR folders hold qrels/<split>.tsv, fix `splits`"
            )
        cols = read_jsonl(folder / "queries.jsonl", ("_id", "text"))
        queries = pl.DataFrame({"query_id": cols["_id"], "text": cols["text"]})
        return (
            queries,
            read_qrels_file(qrels_path),
            {"queries": folder / "queries.jsonl", "qrels": qrels_path},
        )
    spec = _split_entry(entry, split)
    if "queries" not in spec or "qrels" not in spec:
        raise DatasetError(
            f"dataset {entry['name']!r} split {split!r}: msmarco splits need `queries` and `qrels`"
        )
    qpath, qmember = resolve_ref(spec["queries"], entry, data_root, downloads)
    rpath, rmember = resolve_ref(spec["qrels"], entry, data_root, downloads)
    return (
        read_queries_tsv(qpath, qmember),
        read_qrels_file(rpath, rmember),
        {"queries": qpath, "qrels": rpath},
    )


def _read_titles(path: Path, member: str | None) -> pl.DataFrame:
    ids, titles = [], []
    for fields in read_tsv_records(path, member, (1, 2)):
        ids.append(fields[0])
        titles.append(fields[1] if len(fields) == 2 and fields[1] != "-" else "")
    return pl.DataFrame({"doc_id": ids, "new_title": titles})


def _check_unique(frame: pl.DataFrame, column: str, what: str) -> None:
    dupes = frame.filter(pl.col(column).is_duplicated())
    if dupes.height:
        sample = dupes[column].unique(maintain_order=True).head(5).to_list()
        raise DatasetError(
            f"{what}: {dupes[column].n_unique()} duplicated {column}s (e.g. {sample}); ids must be "
            "unique, fix the input file"
        )


def _blank(column: str) -> pl.Expr:
    return pl.col(column).str.strip_chars() == ""


def check_corpus_batch(batch: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Nulls as empty strings; count the documents, empty texts and titles of one batch."""
    batch = batch.with_columns(pl.col("title").fill_null(""), pl.col("text").fill_null(""))
    return batch, {
        "documents": batch.height,
        "empty_text": batch.filter(_blank("text")).height,
        "empty_title": batch.filter(_blank("title")).height,
        "empty_title_and_text": batch.filter(_blank("text") & _blank("title")).height,
    }


def write_corpus(batches: Iterator[pl.DataFrame], path: Path, name: str) -> dict[str, int]:
    """Stream `batches` into corpus.parquet (atomically, one row group per batch); the counts.

    Ids must be unique over the whole corpus: checked on the doc_id column read back before the
    file is renamed into place.
    """
    stats = dict.fromkeys(("documents", "empty_text", "empty_title", "empty_title_and_text"), 0)
    with artifacts.atomic_path(path) as tmp:
        with pq.ParquetWriter(tmp, CORPUS_SCHEMA, compression="zstd") as writer:
            for batch in batches:
                batch, counts = check_corpus_batch(batch)
                stats = {k: stats[k] + counts[k] for k in stats}
                table = batch.select(CORPUS_SCHEMA.names).to_arrow().cast(CORPUS_SCHEMA)
                writer.write_table(table)
        _check_unique(pl.read_parquet(tmp, columns=["doc_id"]), "doc_id", f"{name} corpus")
    return stats


def check_split(
    queries: pl.DataFrame, qrels: pl.DataFrame, doc_ids: pl.DataFrame, what: str
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """Keep the judged queries, keep every judgement of a known query; count each quirk.

    queries_without_qrels: queries of the file never judged in this split (for BEIR, whose
    queries.jsonl holds every split, these are mostly the other splits' queries).
    """
    queries = queries.with_columns(pl.col("text").fill_null(""))
    _check_unique(queries, "query_id", f"{what} queries")
    repeated = qrels.height - qrels.unique(["query_id", "doc_id"]).height
    if repeated:
        raise DatasetError(
            f"{what} qrels: {repeated} repeated (query, document) pairs; each pair must be judged "
            "once, fix the qrels file"
        )
    known = qrels.join(queries.select("query_id"), on="query_id", how="semi")
    judged = queries.join(known.select("query_id").unique(), on="query_id", how="semi")
    missing_docs = known.join(doc_ids, on="doc_id", how="anti")
    self_ids = judged.join(doc_ids.rename({"doc_id": "query_id"}), on="query_id", how="semi")
    stats = {
        "queries": judged.height,
        "queries_without_qrels": queries.height - judged.height,
        "qrels": known.height,
        "qrels_unknown_query": qrels.height - known.height,
        "qrels_missing_document": missing_docs.height,
        "qrels_missing_document_examples": [list(r) for r in missing_docs.head(5).rows()],
        "positive_qrels": known.filter(pl.col("relevance") > 0).height,
        "relevance_levels": {
            str(level): n for level, n in sorted(known.group_by("relevance").len().iter_rows())
        },
        "query_ids_equal_doc_ids": self_ids.height,
        "empty_queries": judged.filter(_blank("text")).height,
    }
    return judged, known, stats


def _params(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry[k] for k in ("name", "format", "title", "exclude_query_id")}


def _small_inputs(inputs: dict[str, Path]) -> dict[str, Path]:
    # Checksumming multi-GB downloads again is slow; their MD5 was verified by the download rule.
    return {k: v for k, v in inputs.items() if Path(v).stat().st_size < (1 << 30)}


def prepare_corpus(
    entry: dict[str, Any],
    out_dir: Path,
    data_root: str | None = None,
    downloads: Path | None = None,
) -> dict[str, Any]:
    """Write corpus.parquet (+ manifest) and dataset.json (title mode, query-id rule, corpus quirks)."""
    batches, inputs = corpus_batches(entry, data_root, downloads)
    path = Path(out_dir) / "corpus.parquet"
    stats = write_corpus(batches, path, entry["name"])
    artifacts.write_manifest(
        artifacts.manifest_path(path),
        stage="datasets.corpus",
        params=_params(entry),
        inputs=_small_inputs(inputs),
        stats=stats,
    )
    info = _params(entry) | {"splits": [s["name"] for s in entry["splits"]], "corpus": stats}
    artifacts.write_json(Path(out_dir) / "dataset.json", info)
    log.info(
        "%s: %d documents, %d with empty text, %d with empty title",
        entry["name"],
        stats["documents"],
        stats["empty_text"],
        stats["empty_title"],
    )
    return info


def prepare_split(
    entry: dict[str, Any],
    split: str,
    out_dir: Path,
    data_root: str | None = None,
    downloads: Path | None = None,
) -> dict[str, Any]:
    """Write queries-{split}.parquet and qrels-{split}.parquet; quirk counts go to their manifests."""
    out_dir = Path(out_dir)
    queries, qrels, inputs = load_split(entry, split, data_root, downloads)
    doc_ids = pl.read_parquet(out_dir / "corpus.parquet", columns=["doc_id"])
    queries, qrels, stats = check_split(queries, qrels, doc_ids, f"{entry['name']} ({split})")
    inputs = _small_inputs(inputs) | {"corpus": out_dir / "corpus.parquet"}
    for kind, frame, schema in (
        ("queries", queries, QUERIES_SCHEMA),
        ("qrels", qrels, QRELS_SCHEMA),
    ):
        path = out_dir / f"{kind}-{split}.parquet"
        artifacts.write_parquet(path, frame.to_arrow(), schema)
        artifacts.write_manifest(
            artifacts.manifest_path(path),
            stage="datasets.split",
            params=_params(entry) | {"split": split},
            inputs=inputs,
            stats=stats,
        )
    log.info(
        "%s/%s: %d queries, %d qrels (%d name documents missing from the corpus, %d name unknown "
        "queries), %d query ids equal to document ids, %d empty queries",
        entry["name"],
        split,
        stats["queries"],
        stats["qrels"],
        stats["qrels_missing_document"],
        stats["qrels_unknown_query"],
        stats["query_ids_equal_doc_ids"],
        stats["empty_queries"],
    )
    return stats


def prepare(
    entry: dict[str, Any],
    out_dir: Path,
    data_root: str | None = None,
    downloads: Path | None = None,
) -> dict[str, Any]:
    """The whole dataset (corpus, then every split) in one call: for tests and notebooks."""
    info = prepare_corpus(entry, out_dir, data_root, downloads)
    info["split_stats"] = {
        s["name"]: prepare_split(entry, s["name"], out_dir, data_root, downloads)
        for s in entry["splits"]
    }
    return info


def main(argv: list[str] | None = None) -> None:
    parser = stage_parser("Write a retrieval dataset in canonical Parquet form.")
    parser.add_argument("command", choices=["corpus", "split"])
    parser.add_argument("--split", help="split name (command `split`)")
    parser.add_argument("--out", required=True, type=Path, help="results/datasets/{dataset}/")
    parser.add_argument(
        "--data-root", default=None, help="extra folder config paths may point into"
    )
    parser.add_argument(
        "--downloads",
        type=Path,
        default=None,
        help="folder of this dataset's downloads (default results/downloads/datasets/<name>)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "corpus":
        prepare_corpus(args.config, args.out, args.data_root, args.downloads)
    elif args.split is None:
        parser.error("`split` needs --split NAME")
    else:
        prepare_split(args.config, args.split, args.out, args.data_root, args.downloads)


if __name__ == "__main__":
    main()
