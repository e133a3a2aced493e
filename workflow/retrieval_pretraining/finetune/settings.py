"""The fine-tuning settings: the slice rules/finetune.smk passes (`finetune_knobs`), typed, checked.

Torch-free. The slice `finetune_knobs` builds holds every knob of the `finetune` section (with the
dataset's overrides) and the dataset's title mode and query-id rule; the fine-tuning rules pass the
trainer only the keys it reads (`trainer_keys`). It accepts the keys only the rules (or encoding,
mining and search) read (`RULE_KEYS`, encode_batch_size, dtype) and ignores them; anything else is
refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..config import ConfigError
from ..retrieval_settings import (RetrievalSettings, check_bool, check_choice, check_int,
                                  check_number, refuse_unknown, slice_keys)

WITHOUT_NEGATIVES = ("pad", "drop")
LR_SCHEDULES = ("linear", "cosine")  # training.LR_SCHEDULES (this module stays torch-free)
# How a stage reads several negatives files (finetune/data.py): each query's lists unioned into one
# example, or each file its own examples (the rules set it: stage2_negatives separate).
NEGATIVE_FILES = ("union", "separate")
# How a query's group is chosen each epoch (finetune/data.py sample_group): drawn afresh, or
# Tevatron's cycle through a per-query order (the BoW authors' bowdpr keeps it).
GROUP_SAMPLING = ("draw", "cycle")
# Whose positives a separate example trains on: its query's (qrels), or also those its negatives
# file's row lists (the BoW authors' mined QA file: mining.answer_positives).
EXAMPLE_POSITIVES = ("query", "file")
# Slice keys the trainer does not read: which encoder and negatives a stage starts from and how
# many stages there are (the rules' input functions), encoding jobs, run depth.
RULE_KEYS = ("rounds", "epochs_mined", "stage1", "stage1_init", "stage2_init", "stage2_negatives",
             "shards", "search_depth")
# Trainer keys no config section holds: the rules add them to a stage's slice (finetune_argument).
STAGE_KEYS = ("negative_files",)
# The retrieval knobs the trainer reads (how texts are cut, joined and pooled); the others
# (encode_batch_size, dtype) say how a corpus is encoded and stored later, not what is trained.
TRAINED_RETRIEVAL_KEYS = ("pooling", "similarity", "q_len", "p_len", "title")


@dataclasses.dataclass(frozen=True)
class FinetuneSettings:
    retrieval: RetrievalSettings = dataclasses.field(default_factory=RetrievalSettings)
    temperature: float = 1.0
    group_size: int = 8             # passages per query: 1 positive + group_size-1 negatives
    batch_size: int = 64            # queries per optimiser step, over all GPUs
    sub_batches: int = 1            # fixed contrast sets per batch (data.contrast_plan)
    gather: bool = False            # all-gather passages across GPUs within a contrast set
    # Gradient caching (model.cached_contrast_set): a process's share of a contrast set is encoded
    # this many queries (with their groups) a forward pass, twice; null = in one pass.
    cache_chunk: int | None = None
    # Embed [CLS] through the model's pre-trained COSTA projector (COSTA Table 6, fine-tuning
    # phase); the exported folder then carries it (projector.py). Per model: a pretrain.models
    # entry's `finetune: {projector: true}`; the paper's main setting fine-tunes without it.
    projector: bool = False
    lr: float = 5e-6
    warmup_ratio: float = 0.1
    # The BoW authors' recipe: cosine to 0.1 x lr after 1000 warm-up steps (finetune/schedule.py).
    lr_schedule: str = "linear"     # linear (COSTA, Tevatron) | cosine
    min_lr_ratio: float = 0.0       # the decay ends at min_lr_ratio x lr; in [0, 1)
    warmup_steps: int | None = None  # the warm-up in steps, instead of warmup_ratio; null = ratio
    weight_decay: float = 0.0
    max_grad_norm: float | None = None  # none; the COSTA scripts clip at 1.0 (paper.yaml)
    epochs: int = 3
    precision: str = "auto"         # auto (bf16 on CUDA) | fp32
    train_queries: int | None = None  # low-resource mode / demo: N sampled training queries
    train_sample: int = 0           # which of the K seeded samples of N queries
    queries_without_negatives: str = "pad"  # pad (random corpus documents; not Tevatron's) | drop
    # The dataset's query-id rule (exclude_query_id: a query is the document of its id): padding
    # then never draws that document, as mining never keeps it (data.sample_group).
    exclude_self: bool = False
    negative_files: str = "union"   # union | separate (NEGATIVE_FILES); set by the rules
    group_sampling: str = "draw"    # draw | cycle (GROUP_SAMPLING)
    example_positives: str = "query"  # query | file (EXAMPLE_POSITIVES), separate examples
    save_every_steps: int = 500
    log_every_steps: int = 10

    def __post_init__(self) -> None:
        check_number("finetune.temperature", self.temperature, low=0, low_open=True)
        for key in ("group_size", "batch_size", "sub_batches", "epochs", "save_every_steps",
                    "log_every_steps"):
            check_int(f"finetune.{key}", getattr(self, key), 1)
        check_bool("finetune.gather", self.gather)
        check_int("finetune.cache_chunk", self.cache_chunk, 1, nullable=True)
        check_bool("finetune.projector", self.projector)
        if self.projector and self.retrieval.pooling != "cls":
            raise ConfigError(f"the model's finetune.projector (pretrain.models[].finetune) "
                              f"embeds [CLS] through COSTA's projector, but finetune.pooling is "
                              f"{self.retrieval.pooling!r}; use pooling cls")
        check_number("finetune.lr", self.lr, low=0, low_open=True)
        check_number("finetune.warmup_ratio", self.warmup_ratio, low=0, high=1)
        check_choice("finetune.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        if self.min_lr_ratio == 1 and not isinstance(self.min_lr_ratio, bool):
            raise ConfigError(f"finetune.min_lr_ratio {self.min_lr_ratio!r} must be a number >= 0 "
                              f"and < 1: the lr decays to min_lr_ratio x lr, so 1 is no decay")
        check_number("finetune.min_lr_ratio", self.min_lr_ratio, low=0, high=1)
        check_int("finetune.warmup_steps", self.warmup_steps, 0, nullable=True)
        check_number("finetune.weight_decay", self.weight_decay, low=0)
        check_number("finetune.max_grad_norm", self.max_grad_norm, low=0, low_open=True,
                     nullable=True)
        check_choice("finetune.precision", self.precision, ("auto", "fp32"))
        check_int("finetune.train_queries", self.train_queries, 1, nullable=True)
        check_int("finetune.train_sample", self.train_sample, 0)
        check_choice("finetune.queries_without_negatives", self.queries_without_negatives,
                     WITHOUT_NEGATIVES)
        check_bool("exclude_self", self.exclude_self)
        check_choice("finetune.negative_files", self.negative_files, NEGATIVE_FILES)
        check_choice("finetune.group_sampling", self.group_sampling, GROUP_SAMPLING)
        check_choice("finetune.example_positives", self.example_positives, EXAMPLE_POSITIVES)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "FinetuneSettings":
        """From the slice the finetune rules pass (defaults for missing keys; unknown refused)."""
        refuse_unknown(config, slice_keys(*STAGE_KEYS), "finetune")
        own = {f.name: config[f.name] for f in dataclasses.fields(cls)
               if f.name != "retrieval" and f.name in config}
        return cls(retrieval=RetrievalSettings.from_config(config, added=STAGE_KEYS,
                                                           stage="finetune"), **own)

    def record(self) -> dict[str, Any]:
        """One flat dict, as the encoder's manifest and training.json record the settings (and a
        resume state must match): the keys the trainer reads (`trainer_keys`)."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "retrieval"}
        retrieval = {k: v for k, v in self.retrieval.record().items()
                     if k in TRAINED_RETRIEVAL_KEYS}
        return {**retrieval, **own}


def caching_chunk(knobs: Mapping[str, Any]) -> Any:
    """The slice's `cache_chunk`, or None where it is at or above a contrast set's queries
    (batch_size // sub_batches): no micro-batch on any GPU count is larger (a process's share of
    a set, data.contrast_plan), so no step caches and every step is null's. The rules hand a job
    this value (finetune_argument: Snakemake reruns a job whose params changed, so such a key,
    a no-op, must not) and a resumable state matches on it (train.resume_settings). A value the
    settings would refuse is passed on unchanged, for them to refuse."""
    chunk, batch, subs = (knobs.get(k) for k in ("cache_chunk", "batch_size", "sub_batches"))
    numbers = all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                  for v in (chunk, batch, subs))
    return None if numbers and chunk >= batch // subs else chunk


def trainer_keys() -> frozenset[str]:
    """The slice keys the trainer reads: the slice rules/finetune.smk hands a fine-tuning job is cut
    to them, so that no other knob (shards, search_depth, encode_batch_size...) is a rerun trigger
    of fine-tuning (Snakemake reruns a job whose params changed)."""
    own = {f.name for f in dataclasses.fields(FinetuneSettings) if f.name != "retrieval"}
    return frozenset(own | set(TRAINED_RETRIEVAL_KEYS))
