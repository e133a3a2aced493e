"""Published numbers to place beside ours, as data (no code should hard-code a paper's value elsewhere).

Sources: the papers as summarised in the project's REFERENCE notes (COSTA SIGIR 2022 Tables 2/3,
CPDAE CIKM 2022, Bag-of-Word SIGIR 2024, the Condenser SciFact anchor of Tevatron's example) and
the regression anchors measured on exactly the data shipped in data/ (Anserini's BEIR/MS MARCO
regressions, MTEB).

Keys:
- `benchmark` names a (collection, query set) pair independently of our dataset names, so a table
  column says which benchmark it is (`benchmark: msmarco-passage-dev`) and the lookup needs no
  knowledge of how a dataset was prepared.
- `system` is a pre-training objective (`none` is the "BERT" row) or a named reference system.
- `group` is the fine-tuning setting: `bm25-negatives`, `hard-negatives` (passage), `round1`,
  `round2` (document mining rounds); None for systems not fine-tuned by the paper's recipe (BM25,
  zero-shot anchors) or where the source does not say which setting a number belongs to.
- measures use ir_measures' names (`RR@10` is what papers call MRR@10).
- `in_domain`: the published model was also pre-trained on the benchmark's own collection (the
  BoW paper's MS MARCO rows). Such a number sits only beside a model pre-trained on that column's
  dataset (`corpora.pretraining_datasets`), and a number for a model pre-trained elsewhere only
  beside one that was not: a Wikipedia-only row is not compared with an in-domain one.
- `base`: the checkpoint the published model's pre-training started from, as the Hub names it
  (every number in PAPER: bert-base-uncased). Such a number sits only beside a row whose
  pre-training chain (`init`, `reuse_pretraining`) starts from that checkpoint, whole
  (`pretraining_base`): a Condenser pre-trained from MiniLM or BGE is not compared with BERT-base's
  Condenser. BM25 numbers and reference rows do not read it.
- `zero_shot`: the published model never trained on the benchmark's own training data. A column
  on a zero-shot target (`evaluate.zero_shot`: rows fine-tuned on another dataset) takes only such
  numbers, and every other column only the others: Tevatron's Condenser, fine-tuned on SciFact
  train, is not compared with a Condenser fine-tuned on MS MARCO and run on SciFact.
- `bm25_title` (BM25 numbers): the text the published run indexed, as `bm25.title` names it
  (`none`: the text alone, Anserini's MS MARCO passage runs; `space`: title + " " + text,
  Anserini's BEIR flat runs). A BM25 row shows the number only where its dataset's own setting
  (bm25.overrides applied) is the same, as it does for k1 and b.
- a source starting "measured here" is no publication: the number was measured on the same data
  with the stated tool, and a table says so wherever it shows one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .corpora import pretraining_chain

# The checkpoint every number in PAPER was pre-trained from (`Published.base`).
BERT_BASE = "google-bert/bert-base-uncased"


@dataclass(frozen=True)
class Published:
    source: str
    system: str
    benchmark: str
    measure: str
    value: float
    group: str | None = None
    note: str = ""
    in_domain: bool = False
    zero_shot: bool = False
    bm25_title: str | None = None
    base: str = BERT_BASE

    @property
    def measured_here(self) -> bool:
        return self.source.startswith("measured here")


_COSTA = "COSTA (Ma et al., SIGIR 2022)"
_CPDAE = "CPDAE (CIKM 2022)"
_BOW = "Bag-of-Word prediction (SIGIR 2024)"
_ANSERINI = "Anserini regression"
_TEVATRON = "Tevatron SciFact example"
# The baselines' own papers, as Papers with Code lists their results (the search tools here hold
# that listing, not the papers' tables); each fine-tuned by its own paper's recipe.
_CONDENSER = "Condenser (Gao & Callan, EMNLP 2021), via Papers with Code"
_COCONDENSER = "coCondenser (Gao & Callan, ACL 2022), via Papers with Code"

PAPER: tuple[Published, ...] = (
    # COSTA Table 2, MS MARCO passage dev (MRR@10 / R@1000) and TREC DL19 passage nDCG@10.
    Published(_COSTA, "costa", "msmarco-passage-dev", "RR@10", 0.342, "bm25-negatives"),
    Published(_COSTA, "costa", "msmarco-passage-dev", "R@1000", 0.959, "bm25-negatives"),
    Published(_COSTA, "costa", "msmarco-passage-dev", "RR@10", 0.366, "hard-negatives"),
    Published(_COSTA, "costa", "msmarco-passage-dev", "R@1000", 0.971, "hard-negatives"),
    Published(_COSTA, "none", "msmarco-passage-dev", "RR@10", 0.316, "bm25-negatives"),
    Published(_COSTA, "none", "msmarco-passage-dev", "R@1000", 0.941, "bm25-negatives"),
    Published(_COSTA, "none", "msmarco-passage-dev", "RR@10", 0.335, "hard-negatives"),
    Published(_COSTA, "none", "msmarco-passage-dev", "R@1000", 0.957, "hard-negatives"),
    Published(_COSTA, "costa", "dl19-passage", "nDCG@10", 0.635, "bm25-negatives"),
    Published(_COSTA, "costa", "dl19-passage", "nDCG@10", 0.704, "hard-negatives"),
    Published(_COSTA, "none", "dl19-passage", "nDCG@10", 0.616, "bm25-negatives"),
    Published(_COSTA, "none", "dl19-passage", "nDCG@10", 0.661, "hard-negatives"),
    # COSTA Table 3, MS MARCO document dev (MRR@100 / R@100) and TREC DL19 document nDCG@10.
    Published(_COSTA, "costa", "msmarco-doc-dev", "RR@100", 0.395, "round1"),
    Published(_COSTA, "costa", "msmarco-doc-dev", "R@100", 0.894, "round1"),
    Published(_COSTA, "costa", "msmarco-doc-dev", "RR@100", 0.422, "round2"),
    Published(_COSTA, "costa", "msmarco-doc-dev", "R@100", 0.919, "round2"),
    Published(_COSTA, "none", "msmarco-doc-dev", "RR@100", 0.358, "round1"),
    Published(_COSTA, "none", "msmarco-doc-dev", "R@100", 0.869, "round1"),
    Published(_COSTA, "none", "msmarco-doc-dev", "RR@100", 0.389, "round2"),
    Published(_COSTA, "none", "msmarco-doc-dev", "R@100", 0.877, "round2"),
    Published(_COSTA, "costa", "dl19-doc", "nDCG@10", 0.582, "round1"),
    Published(_COSTA, "costa", "dl19-doc", "nDCG@10", 0.626, "round2"),
    # CPDAE: the paper's headline numbers; which fine-tuning setting they belong to is not recorded
    # in our notes, so they carry group None and are shown beside the final group (tables/build.py).
    Published(_CPDAE, "cpdae", "msmarco-passage-dev", "RR@10", 0.355, None, "setting not stated"),
    Published(_CPDAE, "cpdae", "msmarco-passage-dev", "R@1000", 0.968, None, "setting not stated"),
    Published(_CPDAE, "cpdae", "dl19-passage", "nDCG@10", 0.696, None, "setting not stated"),
    Published(_CPDAE, "cpdae", "msmarco-doc-dev", "RR@100", 0.408, None, "setting not stated"),
    Published(_CPDAE, "cpdae", "msmarco-doc-dev", "R@100", 0.907, None, "setting not stated"),
    # Bag-of-Word: fine-tuned with the authors' own recipe: bow.yaml's msmarco-passage-bow runs it;
    # beside paper.yaml's msmarco-passage (COSTA's recipe) it is not like for like. Its
    # MS MARCO model was pre-trained further on the MS MARCO passages (in-domain, 144 tokens), at
    # the 15% encoder masking the paper reports its gains at (Table 6), where paper.yaml's bow rows
    # (bow-marco, which these sit beside, included) mask 30% whole words, the authors' code.
    Published(
        _BOW, "bow", "msmarco-passage-dev", "RR@10", 0.384, "bm25-negatives",
        "authors' recipe, pre-trained on MS MARCO too, 15% masking (our row: 30% whole words)",
        in_domain=True,
    ),
    Published(
        _BOW, "bow", "msmarco-passage-dev", "RR@10", 0.401, "hard-negatives",
        "authors' recipe, pre-trained on MS MARCO too, 15% masking (our row: 30% whole words)",
        in_domain=True,
    ),
    # The BoW paper's baselines as their own papers report them: their own fine-tuning recipes
    # (coCondenser: BM25 negatives, then mined ones with stage 2 restarted from the pre-trained
    # model), so group None, shown beside the final group. coCondenser's MS MARCO number comes
    # from its corpus-aware pre-training on MS MARCO (the Hub's Luyu/co-condenser-marco, the
    # model Tevatron's MS MARCO example fine-tunes), so it sits beside an in-domain row only;
    # its NQ numbers are the Wikipedia model's.
    Published(
        _CONDENSER, "condenser", "msmarco-passage-dev", "RR@10", 0.366, None, "its own recipe",
    ),
    Published(_CONDENSER, "condenser", "nq-test", "Acc@20", 0.832, None, "its own recipe"),
    Published(
        _COCONDENSER, "cocondenser", "msmarco-passage-dev", "RR@10", 0.382, None,
        "its own recipe, pre-trained on MS MARCO too", in_domain=True,
    ),
    Published(_COCONDENSER, "cocondenser", "nq-test", "Acc@5", 0.758, None, "its own recipe"),
    Published(_COCONDENSER, "cocondenser", "nq-test", "Acc@20", 0.843, None, "its own recipe"),
    # Condenser fine-tuned on SciFact train with Tevatron's SciFact example (its documentation;
    # bert-base 0.747 in the same example). Not the COSTA
    # recipe, and the setting (negatives, stages) is the example's, so group None.
    Published(
        _TEVATRON, "condenser", "scifact-test", "nDCG@10", 0.784, None,
        "Tevatron's SciFact example (fine-tuned on SciFact train)",
    ),
)

# The dataset and split (as the configs name them) each benchmark is. A column's `benchmark` must be
# one of these and match the column's own dataset and split (config_checks.cross_check): a misspelt
# one would silently drop every published number of the column, and another dataset's would print
# that benchmark's number, with a delta, beside our scores of this one.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "msmarco-passage-dev": ("msmarco-passage", "dev"),
    "dl19-passage": ("msmarco-passage", "dl19"),
    "msmarco-doc-dev": ("msmarco-doc", "dev"),
    "dl19-doc": ("msmarco-doc", "dl19"),
    "scifact-test": ("scifact", "test"),
    "nq-test": ("nq", "test"),
    "trivia-test": ("trivia", "test"),
}


def benchmark_mistake(benchmark: str, dataset: str, split: str) -> str | None:
    """Why a column of `dataset`/`split` cannot name `benchmark`; None when it can."""
    if benchmark not in BENCHMARKS:
        return f"'{benchmark}' is not a known benchmark; known: {', '.join(BENCHMARKS)}"
    if BENCHMARKS[benchmark] != (dataset, split):
        expected = "/".join(BENCHMARKS[benchmark])
        return (f"'{benchmark}' is {expected}, but the column scores {dataset}/{split}; name the "
                "benchmark of the column's own data, or none")
    return None


# BM25 depends on (k1, b) and on the indexed text (`bm25_title`): a row may only be compared with
# the number for its own parameters. The SciFact numbers measured here used Anserini's BEIR
# setting (tests/test_bm25.py).
BM25: dict[tuple[float, float], tuple[Published, ...]] = {
    (0.9, 0.4): (
        Published(_ANSERINI, "bm25", "msmarco-passage-dev", "RR@10", 0.1840, bm25_title="none"),
        Published(_ANSERINI, "bm25", "dl19-passage", "nDCG@10", 0.5058, bm25_title="none"),
        Published(_ANSERINI, "bm25", "scifact-test", "nDCG@10", 0.6789, None, "BEIR flat",
                  bm25_title="space"),
        Published("measured here (Pyserini 1.6.0)", "bm25", "scifact-test", "R@100", 0.9253,
                  bm25_title="space"),
        Published("measured here (Pyserini 1.6.0)", "bm25", "scifact-test", "R@1000", 0.9767,
                  bm25_title="space"),
    ),
    # Tuned BM25: the MS MARCO official eval script's MRR@10 (0.18741227770955546), which our
    # RR@10 (ir_measures' MS MARCO implementation) reproduces; Anserini's 0.1875 is trec_eval's
    # recip_rank@10, whose tie order differs, and showed an exact reproduction as Δ -0.001.
    (0.82, 0.68): (
        Published(
            "MS MARCO official eval script, as Anserini/Pyserini's regression docs report it",
            "bm25", "msmarco-passage-dev", "RR@10", 0.1874, bm25_title="none",
        ),
    ),
}

# Reference rows (not ours) that a table can list by name: published anchors for its data.
ANCHORS: dict[str, dict] = {
    "anserini-bm25-flat": {
        "label": "BM25 k1=0.9 b=0.4 (Anserini, published)",
        "values": BM25[(0.9, 0.4)],
    },
    "all-minilm-l6-v2": {
        "label": "all-MiniLM-L6-v2, 6 layers, mean pooling (MTEB, published)",
        "values": (
            Published("MTEB", "all-minilm-l6-v2", "scifact-test", "nDCG@10", 0.6451),
            Published("measured here (this workflow's encoding and FAISS search)",
                      "all-minilm-l6-v2", "scifact-test", "R@100", 0.925),
        ),
    },
    "bge-base-en-v1.5": {
        "label": "BGE-base-en-v1.5 (Anserini, published)",
        "values": (Published(_ANSERINI, "bge-base-en-v1.5", "scifact-test", "nDCG@10", 0.7408),),
    },
}


# The Hub's legacy ids of the checkpoints PAPER's numbers start from: the same repositories.
_HUB_ALIASES = {"bert-base-uncased": BERT_BASE}


def checkpoint_identity(entry: dict[str, Any]) -> str:
    """What a `checkpoints` entry stages, comparable with `Published.base`: its Hub id (legacy
    ids resolved); a truncated one (`num_layers`) or a package or local folder is another model,
    which no published number here started from."""
    if entry["source"] == "hub":
        identity = _HUB_ALIASES.get(entry["location"], entry["location"])
    else:
        identity = f"{entry['source']}:{entry['location']}"
    if entry.get("num_layers") is not None:
        identity += f" (first {entry['num_layers']} layers)"
    return identity


def pretraining_base(
    pretrain: dict[str, Any], checkpoints: list[dict[str, Any]], name: str
) -> str:
    """The checkpoint model `name`'s pre-training chain starts from (`checkpoint_identity`):
    through `reuse_pretraining` (the entry it copies) and `init` (the model it continues) to
    the first model of the chain, whose own `checkpoint` or the section's it is."""
    first = pretraining_chain(pretrain, name)[-1]
    chosen = first.get("checkpoint", pretrain["checkpoint"])
    return checkpoint_identity(next(c for c in checkpoints if c["name"] == chosen))


def paper_value(
    system: str, benchmark: str, measure: str, group: str | None, final_group: bool = False,
    in_domain: bool = False, zero_shot: bool = False,
    base: str | None = BERT_BASE,
) -> Published | None:
    """The published number for an objective in a fine-tuning setting, if the papers report one,
    for a model pre-trained on the benchmark's own collection or not (`in_domain`), for a
    column the rows were or were not fine-tuned for (`zero_shot`) and for a model pre-trained
    from `base` (`pretraining_base`; None, unknown: no number; module docstring). The default
    `base` is the papers' own start; the tables pass each row's.

    A number whose setting is unknown (group None) is matched only in the final group, where a
    paper's headline model would sit; an exact group match always wins.
    """
    candidates = [
        p for p in PAPER if (p.in_domain, p.zero_shot, p.base) == (in_domain, zero_shot, base)
    ]
    if group is not None:  # a stage with no published counterpart never takes a group-less number
        exact = [
            p
            for p in candidates
            if (p.system, p.benchmark, p.measure, p.group) == (system, benchmark, measure, group)
        ]
        if exact:
            return exact[0]
    if final_group:
        loose = [
            p
            for p in candidates
            if (p.system, p.benchmark, p.measure) == (system, benchmark, measure)
            and p.group is None
        ]
        if loose:
            return loose[0]
    return None


def bm25_value(k1: float | None, b: float | None, title: str | None, benchmark: str,
               measure: str) -> Published | None:
    """The published BM25 number for exactly these parameters and this indexed text (`bm25.title`;
    None when unknown or not matching)."""
    if k1 is None or b is None or title is None:
        return None
    for (pk1, pb), values in BM25.items():
        if abs(pk1 - k1) < 1e-9 and abs(pb - b) < 1e-9:
            for p in values:
                if (p.benchmark, p.measure, p.bm25_title) == (benchmark, measure, title):
                    return p
    return None


def anchor_value(name: str, benchmark: str, measure: str) -> Published | None:
    if name not in ANCHORS:
        raise KeyError(f"unknown reference row {name!r}; known: {', '.join(sorted(ANCHORS))}")
    for p in ANCHORS[name]["values"]:
        if (p.benchmark, p.measure) == (benchmark, measure):
            return p
    return None
