"""How `audit` shows and checks index folders: a Lucene folder's segments, a FAISS index's size
and metric with one docid line per vector, its vectors and dimension against the folder's manifest
(and the manifest's inputs against their checksums); a file inside either is audited as its
folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..base import (
    RANK_FOLDER, RANK_MEMBER, RANK_NAME, Audit, Kind, NotAnArtifact, describe_origin,
    folder_stage, load_manifest, read_manifest, show_manifest, show_snakemake_record,
)

FILES = [
    ("bm25/*/index/*", "a file of a BM25 (Lucene) index folder", "build_bm25_index"),
    ("index/*/faiss/*", "a file of a dense (FAISS) index folder", "build_dense_index"),
    ("baselines/*/faiss/*", "a file of a baseline encoder's FAISS index folder",
     "build_baseline_index"),
]


READ_BYTES = 1 << 20  # a docid file is read this much at a time


def docid_lines(path: Path) -> int:
    """The lines of a docid file (a last one without its newline counts, as
    faiss_index.read_doc_ids reads it), counted a block at a time: MS MARCO's 8.8M ids as Python
    strings took ~600 MB."""
    lines, last = 0, b"\n"
    with path.open("rb") as f:
        while block := f.read(READ_BYTES):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def first_docids(path: Path, n: int) -> list[str]:
    with path.open(encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n") for line, _ in zip(f, range(n))]


# The stage build_dense_index records in its folder's manifest.json (faiss_index.build).
DENSE_INDEX_STAGE = "build_dense_index"


def index_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a FAISS index: build_dense_index writes it as its folder's manifest.json
    (an `index.manifest.json` beside `index` it never writes)."""
    manifest = read_manifest(path)
    folder_manifest = path.parent / "manifest.json"
    if manifest is None and path.name == "index" and folder_manifest.is_file():
        return load_manifest(folder_manifest)
    return manifest


def check_against_manifest(a: Audit, index, manifest: dict[str, Any] | None) -> None:
    """The vectors and their dimension as build_dense_index counted them (its stats)."""
    stats = (manifest or {}).get("stats") or {}
    if "documents" in stats:
        a.check(
            "vectors equal the manifest's documents",
            stats["documents"] == index.ntotal,
            f"{index.ntotal} vs {stats['documents']}",
        )
    if "dim" in stats:
        a.check("dimension equals the manifest's", stats["dim"] == index.d,
                f"{index.d} vs {stats['dim']}")


def audit_faiss(a: Audit, n: int) -> None:
    import faiss

    a.kind = "FAISS index"
    try:
        # Mapped, as faiss_index.load does: read, MS MARCO's index is 27 GB of memory of its own,
        # and the audit looks at its header only.
        index = faiss.read_index(str(a.path), faiss.IO_FLAG_MMAP_IFC)
    except RuntimeError as error:
        why = f"{a.path}: not a FAISS index ({str(error).splitlines()[-1]})"
        manifest = index_manifest(a.path)
        if manifest is None:  # nothing says the workflow wrote it: refused as what it is
            raise NotAnArtifact(why) from error
        show_manifest(a, manifest)
        show_snakemake_record(a, a.path)
        a.check("index reads as a FAISS index", False, f"{why}; rerun the rule that wrote it")
        return
    metric = {faiss.METRIC_INNER_PRODUCT: "inner product", faiss.METRIC_L2: "L2"}.get(
        index.metric_type
    )
    a.say(
        f"-- {type(index).__name__}: {index.ntotal} vectors, dim {index.d}, metric {metric}, "
        f"trained {index.is_trained}"
    )
    manifest = index_manifest(a.path)
    show_manifest(a, manifest)
    check_against_manifest(a, index, manifest)
    show_snakemake_record(a, a.path)
    docid = a.path.parent / "docid"
    if docid.is_file():
        count = docid_lines(docid)
        a.check(
            "one docid line per vector (Pyserini FaissSearcher layout)",
            count == index.ntotal,
            f"{count} vs {index.ntotal}",
        )


def is_faiss_folder(folder: Path) -> bool:
    """A FAISS folder: `index` and `docid`, or the manifest.json build_dense_index writes in it
    (one that lost either file, audited, fails "has index and docid" instead of being refused as
    no artifact)."""
    return ((folder / "index").is_file() and (folder / "docid").is_file()
            or folder_stage(folder) == DENSE_INDEX_STAGE)


def audit_faiss_folder(a: Audit, n: int) -> None:
    a.kind = "FAISS folder (Pyserini layout: index + docid)"
    missing = [name for name in ("index", "docid") if not (a.path / name).is_file()]
    if missing:  # recognised by build_dense_index's manifest alone
        show_manifest(a, read_manifest(a.path))
        show_snakemake_record(a, a.path)
        a.check("has index and docid (Pyserini layout)", False,
                f"missing {' and '.join(missing)}; rerun the rule that wrote it")
        return
    inner = Audit(a.path / "index")
    audit_faiss(inner, n)
    a.lines, a.checks = inner.lines, inner.checks
    a.say("-- first docids: " + ", ".join(first_docids(a.path / "docid", n)))


def copied_index(folder: Path) -> str | None:
    """The dataset whose BM25 index `folder` (results/bm25/<dataset>/index) is a copy of
    (alias_bm25_index), from its manifest: build_bm25_index records the corpus it indexed,
    results/datasets/<source>/corpus.parquet, and the copy's manifest is the source's. None for
    a folder that indexed its own dataset's corpus, or whose manifest says nothing of one."""
    if folder.name != "index" or folder.parent.parent.name != "bm25":
        return None
    corpus = (((read_manifest(folder) or {}).get("inputs") or {}).get("corpus") or {}).get("path")
    if not isinstance(corpus, str) or Path(corpus).name != "corpus.parquet":
        return None
    source = Path(corpus).parent.name
    return source if source != folder.parent.name else None


# The stage build_bm25_index records in its index folder's manifest.json (bm25.build_index).
LUCENE_STAGE = "bm25.index"


def is_lucene_folder(folder: Path) -> bool:
    """A Lucene index folder: segments_* files, or the manifest.json build_bm25_index writes in it.
    One that lost its segments is this workflow's index all the same: audited, it fails "has a
    segments file" (exit 1) instead of being refused as no artifact (exit 2). A folder holding
    another stage's manifest is not claimed."""
    return any(folder.glob("segments_*")) or folder_stage(folder) == LUCENE_STAGE


def audit_lucene(a: Audit, n: int) -> None:
    a.kind = "Lucene index folder"
    files = [p for p in a.path.iterdir() if p.is_file()]
    a.say(
        f"-- {len(files)} files, {sum(p.stat().st_size for p in files) / 1e6:.1f} MB; "
        f"segments: {sorted(p.name for p in files if p.name.startswith('segments'))}"
    )
    source = copied_index(a.path)
    if source is not None:
        a.say(f"-- a copy of {source}'s index (alias_bm25_index): its manifest's corpus is "
              f"{source}'s")
    a.check("has a segments file", any(p.name.startswith("segments_") for p in files))
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)


def audit_folder_member(a: Audit, n: int) -> None:
    """A file inside a Lucene or FAISS folder: what it is, then the folder's own audit."""
    folder = a.path.parent
    inner = Audit(folder)
    (audit_lucene if is_lucene_folder(folder) else audit_faiss_folder)(inner, n)
    a.kind = f"file of a {inner.kind}"
    copied = copied_index(folder) is not None
    describe_origin(a, "a file of an index folder", required=False,
                    rule="alias_bm25_index" if copied else None)
    a.say(f"-- {a.path.name}: {a.path.stat().st_size:,} bytes; the folder {folder}:")
    a.lines += inner.lines
    a.checks += inner.checks


def is_folder_member(p) -> bool:
    parent = p.path.parent
    # (`index` beside its docid is a .faiss file first; here, one whose docid is gone)
    return is_lucene_folder(parent) or (p.name in ("docid", "index") and is_faiss_folder(parent))


KINDS = [
    Kind(f"a Lucene index (segments_*, or a {LUCENE_STAGE} manifest.json)", RANK_FOLDER + 1,
         "folder", lambda p: is_lucene_folder(p.path), audit_lucene),
    Kind(f"a FAISS folder (index + docid, or a {DENSE_INDEX_STAGE} manifest.json)",
         RANK_FOLDER + 2, "folder", lambda p: is_faiss_folder(p.path), audit_faiss_folder),
    Kind(".faiss", RANK_NAME + 3, "file",
         lambda p: p.name.endswith(".faiss") or (
             p.name == "index" and (p.path.parent / "docid").exists()),
         audit_faiss),
    Kind("a file of an index folder", RANK_MEMBER, "file", is_folder_member, audit_folder_member),
]
