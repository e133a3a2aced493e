"""The config's references the rules resolve into files, checked when the workflow parses
(rules/common.smk calls `check`, after config_checks.validate): the splits that finetune, evaluate,
bm25 negatives and the t-SNE figure name, the report's stage suffixes, significance baselines, t-SNE
stage and low-resource systems, and finetune's `stage1_init`; each fine-tuned dataset's mining
policy (`mining.overrides` applied: mining_policy, which the rules pass too); and the datasets
`bm25.overrides` names.

The rules build whatever a target names, so a misspelt split or stage stopped the dry run at a
missing file or an input function's error that named no config key (or named the wrong one), and
a stage past a dataset's `rounds` trained mining rounds the config does not list. No stage imports
this module: what it checks changes no result, so editing it is no job's code input (config.py is
every job's). The systems a report reads are listed here too (table_systems, low_resource_systems):
rules/report.smk builds what they list and the check covers the same list.
"""

from __future__ import annotations

from typing import Any

from . import dataset_aliases
from .config import STAGE, ConfigError


def _names(entries: list[dict[str, Any]] | None) -> list[str]:
    return [entry["name"] for entry in entries or []]


def check(config: dict[str, Any]) -> None:
    """Raise ConfigError naming every stage reference nothing builds (config_checks.validate
    first). A dataset alias (same_as) is read as its source's entry, whose splits it has."""
    config = config | {"datasets": dataset_aliases.resolve(config["datasets"])}
    messages = split_mistakes(config) + stage1_init_mistakes(config) + mining_mistakes(config)
    messages += projector_stage1_mistakes(config)
    messages += bm25_override_mistakes(config)
    messages = list(dict.fromkeys(messages + report_stage_mistakes(config)))
    if messages:
        raise ConfigError("invalid config:\n  " + "\n  ".join(messages))


def split_mistakes(config: dict[str, Any]) -> list[str]:
    """Each split a section names must be one its dataset lists (a dataset no entry names is
    config_checks.validate's to report; a dpr negatives split is
    config_checks._negatives_mistakes')."""
    splits = {entry["name"]: [s["name"] for s in entry["splits"]] for entry in config["datasets"]}
    named = [(f"finetune.datasets.{i}.split", e["dataset"], e["split"])
             for i, e in enumerate(config["finetune"]["datasets"])]
    named += [(f"evaluate.splits.{i}.split", e["dataset"], e["split"])
              for i, e in enumerate(config["evaluate"]["splits"])]
    named += [(f"bm25.negatives.{i}.split", e["dataset"], e["split"])
              for i, e in enumerate(config["bm25"].get("negatives") or [])
              if e["source"] != "dpr"]
    messages = [f"config key '{key}': '{split}' is not a split of '{dataset}'; its splits: "
                f"{', '.join(splits[dataset])}"
                for key, dataset, split in named
                if dataset in splits and split not in splits[dataset]]
    tsne = config["report"]["analysis"]["tsne"]
    scored = {(e["dataset"], e["split"]) for e in config["evaluate"]["splits"]}
    if tsne and (tsne["dataset"], tsne["split"]) not in scored:
        messages.append(
            f"config key 'report.analysis.tsne.split': no evaluate.splits entry scores "
            f"{tsne['dataset']} {tsne['split']} (the figure marks what its measures count "
            "relevant); add one, or name a split it scores")
    return messages


def _rounds(config: dict[str, Any]) -> dict[str, int]:
    """{dataset: mining rounds} of every dataset a fine-tuned encoder searches: a finetune.datasets
    entry's (its overrides applied), a zero-shot target's source's."""
    shared = config["finetune"]["rounds"]
    rounds = {entry["dataset"]: entry.get("overrides", {}).get("rounds", shared)
              for entry in config["finetune"]["datasets"]}
    for entry in config["evaluate"].get("zero_shot") or []:
        if entry["trained_on"] in rounds:
            rounds.setdefault(entry["dataset"], rounds[entry["trained_on"]])
    return rounds


def _stage_mistake(key: str, stage: str, dataset: str, rounds: dict[str, int]) -> str | None:
    """Why `stage` names no system the rules build on `dataset` (one of `rounds`), or None. A
    dataset's stages are stage0 (the pre-trained encoder) to stage<rounds + 1>: the rules build
    whatever stage is asked for, so a later one would train mining rounds the config does not
    list."""
    match = STAGE.fullmatch(stage)
    if not match:
        return (f"config key '{key}': '{stage}' is not a fine-tuning stage; write stage<k> "
                "(stage0: not fine-tuned, stage1: BM25 negatives, stage<k+1>: mining round k) or "
                "n<N>s<K>-stage<k> (N sampled training queries, sample K)")
    last = rounds[dataset] + 1
    if int(match["number"]) > last:
        return (f"config key '{key}': '{stage}' on '{dataset}' would train mining round "
                f"{int(match['number']) - 1}, and finetune.rounds is {rounds[dataset]} there "
                f"(stages up to stage{last}); raise rounds (finetune.datasets overrides) or name "
                "a stage it has")
    return None


def _dense_dataset_mistake(key: str, dataset: str, rounds: dict[str, int]) -> str | None:
    """Why our models have no runs on `dataset`: each takes its encoder and retrieval knobs from
    the dataset's fine-tuning entry, or a zero-shot target's source's."""
    if dataset in rounds:
        return None
    return (f"config key '{key}': our models' runs on '{dataset}' take their encoders and knobs "
            f"from its finetune.datasets entry, and '{dataset}' is neither fine-tuned on nor an "
            "evaluate.zero_shot target; add it to one of them")


def stage1_init_mistakes(config: dict[str, Any]) -> list[str]:
    """finetune `stage1_init: <dataset>/<stage>` must name another fine-tuned dataset's stage."""
    messages, rounds = [], _rounds(config)
    finetuned = [entry["dataset"] for entry in config["finetune"]["datasets"]]
    for i, entry in enumerate(config["finetune"]["datasets"]):
        own = entry.get("overrides", {})
        key = (f"finetune.datasets.{i}.overrides.stage1_init" if "stage1_init" in own
               else "finetune.stage1_init")
        source = own.get("stage1_init", config["finetune"]["stage1_init"])
        if source == "pretrained":
            continue
        dataset, stage = source.split("/")
        if dataset not in finetuned or dataset == entry["dataset"]:
            messages.append(
                f"config key '{key}': '{dataset}' in '{source}' is not another finetune.datasets "
                f"entry than '{entry['dataset']}'; known: {', '.join(finetuned)}")
            continue
        if mistake := _stage_mistake(key, stage, dataset, rounds):
            messages.append(mistake)
    return messages


def _untrained_stage1_source(config: dict[str, Any], dataset: str) -> str | None:
    """The `stage1_init` source of `dataset`'s stage 1 when that stage is the pre-trained
    encoder itself, untrained (rules/finetune.smk encoder_path: stage1: init on stage1_init
    pretrained, a `<dataset>/stage0`, or another such stage 1), else None."""
    entries = {entry["dataset"]: entry.get("overrides", {})
               for entry in config["finetune"]["datasets"]}
    seen = set()
    while dataset in entries and dataset not in seen:
        seen.add(dataset)
        knobs = config["finetune"] | entries[dataset]
        if knobs["stage1"] != "init":
            return None
        source = knobs["stage1_init"]
        if source == "pretrained":
            return source
        dataset, stage = source.split("/")
        match = STAGE.fullmatch(stage)
        if not match or int(match["number"]) > 1:
            return None  # a fine-tuned stage (or stage1_init_mistakes' to report)
        if int(match["number"]) == 0:
            return source
    return None


def projector_stage1_mistakes(config: dict[str, Any]) -> list[str]:
    """A model fine-tuned through COSTA's projector (pretrain.models[].finetune.projector) cannot
    have a stage 1 that is the pre-trained encoder itself (stage1: init on the pre-trained
    encoder): that folder has no projector.safetensors, so the stage's corpus encoding, mining of
    round 1 and runs would embed the raw [CLS], while every stage trained after it embeds through
    the projector."""
    projected = [model["name"] for model in config["pretrain"]["models"]
                 if (model.get("finetune") or {}).get("projector")
                 and model["name"] in finetune_models(config)]
    messages = []
    for entry in config["finetune"]["datasets"] if projected else []:
        source = _untrained_stage1_source(config, entry["dataset"])
        if source is None:
            continue
        messages.append(
            f"config key 'finetune.stage1' on '{entry['dataset']}': stage 1 is the pre-trained "
            f"encoder itself (stage1: init from '{source}'), which embeds the raw [CLS], but "
            f"{', '.join(projected)} fine-tune through the pre-trained projector "
            "(pretrain.models[].finetune.projector): round 1 would be mined with other vectors "
            "than the model trains; set stage1: bm25, or stage1_init to a fine-tuned stage")
    return messages


# mining's keys that are no policy of a dataset's own: one index per stage serves its mining and
# its dense runs (schemas/mining.schema.yaml, `overrides`).
MINING_SHARED = ("index", "keep_vectors", "overrides")


def mining_policy(config: dict[str, Any], dataset: str) -> dict[str, Any]:
    """The mining policy of `dataset`: the section's policy keys, its `mining.overrides` entry
    applied (rules/dense.smk mining_argument passes it, rules/answers.smk reads its
    negative_filter). A dataset without an entry gets exactly the section's keys, so its jobs'
    params, their rerun trigger, are what they were before overrides existed."""
    mining = config["mining"]
    policy = {key: value for key, value in mining.items() if key not in MINING_SHARED}
    for override in mining.get("overrides") or []:
        if override["dataset"] == dataset:
            policy |= {key: value for key, value in override.items() if key != "dataset"}
    return policy


def window_mistake(window: list | None, depth: int) -> str | None:
    """Why rank_window [lo, hi) is no window on ranks 1..depth, or None: what mine.check_window
    refuses when the job starts (after a whole encode and index build), said at parse time. Kept
    equal to it by tests/test_mining_overrides.py (mine.py imports torch and faiss, too slow and
    heavy for a parse; moving the check there would rerun every mining job)."""
    if window is None:
        return None
    lo, hi = window
    if hi is not None and hi <= lo:
        return f"[{lo}, {hi}) is empty: it must be [lo, hi) with lo < hi (hi may be null)"
    if lo > depth:
        return (f"starts at rank {lo} but depth is {depth}: no query would get a negative; raise "
                "depth or lower the window's lo")
    if hi is not None and hi - 1 > depth:
        return (f"[{lo}, {hi}) reaches past depth {depth} (ranks beyond it are never searched); "
                f"raise depth to {hi - 1} or lower hi to {depth + 1} (or null: up to depth)")
    return None


def mining_mistakes(config: dict[str, Any]) -> list[str]:
    """A mining.overrides entry must name a fine-tuned dataset, once; every fine-tuned dataset's
    policy (its entry merged into the section's) must have a rank_window within its depth, no
    answer_positives without the answers filter and no min_negatives above num_negatives."""
    finetuned = [entry["dataset"] for entry in config["finetune"]["datasets"]]
    overrides = config["mining"].get("overrides") or []

    def unmined(dataset: str) -> str | None:
        if dataset in finetuned:
            return None
        return (f"is not fine-tuned on, so nothing mines it and this policy would be ignored; "
                f"finetune.datasets has: {', '.join(finetuned)}")

    messages, seen, twice = _override_mistakes(config, "mining.overrides", "", unmined)
    formats = {entry["name"]: entry.get("format") for entry in config["datasets"]}

    def key(dataset: str, name: str) -> str:
        """The key that set `name` for `dataset`: its override entry's, else the section's."""
        own = seen.get(dataset)
        if own is not None and name in overrides[own]:
            return f"mining.overrides.{own}.{name}"
        return f"mining.{name}"

    windows, answer_positives, minimums = [], [], []
    for dataset in [d for d in dict.fromkeys(finetuned) if d not in twice]:
        policy = mining_policy(config, dataset)
        why = window_mistake(policy["rank_window"], policy["depth"])
        if why is not None:
            where = (f" on '{dataset}' (depth from {key(dataset, 'depth')})"
                     if dataset in seen else "")
            windows.append(f"config key '{key(dataset, 'rank_window')}':{where} the window {why}")
        why = answer_positives_mistake(policy, formats.get(dataset))
        if why is not None:
            answer_positives.append(
                f"config key '{key(dataset, 'answer_positives')}': on '{dataset}' {why}")
        why = min_negatives_mistake(policy.get("min_negatives"), policy.get("num_negatives"))
        if why is not None:
            minimums.append(f"config key '{key(dataset, 'min_negatives')}': on '{dataset}' {why}")
    return messages + windows + answer_positives + minimums


def min_negatives_mistake(least: int | None, most: int | None) -> str | None:
    """Why min_negatives cannot work beside num_negatives, or None: mine.py cuts a query's
    negatives to num_negatives before it empties those left with fewer than min_negatives, so a
    minimum above the cut empties every query. Said here alone: a check in mine.py (a code input)
    would rerun every mining job."""
    if least is None or most is None or least <= most:
        return None
    return (f"{least} is above num_negatives {most}: a query keeps at most {most}, so every "
            f"query would be left with none; lower it to {most} or less (or null)")


def answer_positives_mistake(policy: dict[str, Any], dataset_format: str | None) -> str | None:
    """Why answer_positives cannot work in `policy`, or None: it needs the answers filter
    (mine.policy refuses it otherwise, when the job starts), and a filter of `auto` is answers on
    a format dpr dataset alone (rules/answers.smk negative_filter)."""
    if not policy.get("answer_positives"):
        return None
    chosen = policy.get("negative_filter", "auto")
    if chosen == "answers" or (chosen == "auto" and dataset_format == "dpr"):
        return None
    return ("it writes the candidates holding an answer as positives, but its negative_filter "
            f"is {chosen!r}, which finds none there (answers: a format dpr dataset, auto "
            "resolving to it); set it false for this dataset")


def bm25_override_mistakes(config: dict[str, Any]) -> list[str]:
    """A bm25.overrides entry must name a datasets entry (an alias too: its `title` decides
    whether its index is copied or built), once. The rules apply an entry to the dataset of its
    name and to no other (rules/common.smk bm25_settings), so a misspelt one left that dataset's
    BM25 on the section's k1, b and title without a word; two entries applied both, the later
    keys winning."""
    return _override_mistakes(config, "bm25.overrides",
                              ", so these settings would apply to no BM25 run")[0]


def _override_mistakes(config: dict[str, Any], section: str, unknown_why: str,
                       unused: Any = None) -> tuple[list[str], dict[str, int], set[str]]:
    """(messages, {dataset: its first entry}, datasets with two entries) of a per-dataset
    overrides list (`section`: "bm25.overrides", "mining.overrides"): an entry naming no datasets
    entry (`unknown_why` says what it costs), one `unused(dataset)` explains away, a dataset
    twice."""
    messages, seen, twice = [], {}, set()
    datasets = _names(config["datasets"])
    head, key_name = section.split(".")
    for i, entry in enumerate(config[head].get(key_name) or []):
        key, dataset = f"{section}.{i}.dataset", entry["dataset"]
        if dataset not in datasets:
            messages.append(f"config key '{key}': '{dataset}' is not a datasets entry"
                            f"{unknown_why}; known: {', '.join(datasets)}")
        elif unused is not None and (why := unused(dataset)):
            messages.append(f"config key '{key}': '{dataset}' {why}")
        elif dataset in seen:
            messages.append(f"config key '{key}': '{dataset}' has an entry already "
                            f"({section}.{seen[dataset]}); give it one, with every key")
            twice.add(dataset)
        seen.setdefault(dataset, i)
    return messages, seen, twice


def finetune_models(config: dict[str, Any]) -> list[str]:
    """The models fine-tuned and evaluated: finetune.models, or (null) every pretrain.models entry.
    Raises here, as every reader of the list (the rules' and table_rows) comes through it."""
    names, chosen = _names(config["pretrain"]["models"]), config["finetune"]["models"]
    unknown = sorted(set(chosen or []) - set(names))
    if unknown:
        raise ValueError(f"finetune.models names {unknown}, not in pretrain.models ({names})")
    return chosen or names


def table_rows(config: dict[str, Any], table: dict[str, Any]) -> list[dict[str, Any]]:
    """A table's model rows: its own, or (rows: null) the fine-tuned models; [] = none (a table of
    baselines alone)."""
    rows = table.get("rows")
    return [{"model": m} for m in finetune_models(config)] if rows is None else rows


def table_systems(config: dict[str, Any],
                  table: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(config key, system, stage) of every system one table reads on each of its columns: BM25,
    the rows' models at each stage suffix, the baseline rows and the significance baselines. The
    stage is "" for BM25 or a baseline encoder, None for a `system` nothing builds. The one source
    of what a table reads: rules/report.smk builds these cells, report_stage_mistakes checks them.
    """
    report, where = config["report"], f"report.tables[{table['name']}]"
    groups = table.get("groups")
    stages = ([(f"{where}.groups.{i}.suffix", g["suffix"]) for i, g in enumerate(groups)]
              if groups else
              [(f"report.stages.{i}.suffix", g["suffix"]) for i, g in enumerate(report["stages"])])
    models = [row["model"] for row in table_rows(config, table)]
    systems = [(f"{where}.bm25", "bm25", "")] if table.get("bm25", True) else []
    systems += [(key, f"{m}-{suffix}", suffix) for key, suffix in stages for m in models]
    systems += [(f"{where}.baseline_rows", name, "") for name in table.get("baseline_rows") or []]
    own = table.get("baselines")  # [] = no tests (tables/significance.baselines_for)
    prefix = f"{where}.baselines" if own is not None else "report.significance.baselines"
    for i, baseline in enumerate(report["significance"]["baselines"] if own is None else own):
        if "system" in baseline:
            system = baseline["system"]
            systems.append((f"{prefix}.{i}.system", system, _system_stage(config, system)))
        elif "model" in baseline and models:
            systems += [(key, f"{baseline['model']}-{suffix}", suffix) for key, suffix in stages]
        else:  # each row's own model at that stage (e.g. stage0, before fine-tuning)
            systems += [(f"{prefix}.{i}.stage", f"{m}-{baseline['stage']}", baseline["stage"])
                        for m in models]
    return systems


def report_systems(config: dict[str, Any], table: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(dataset, system, split) of every cell of one configured table."""
    systems = [system for _, system, _ in table_systems(config, table)]
    return [(c["dataset"], system, c["split"]) for c in table["columns"] for system in systems]


def low_resource_systems(config: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(dataset, system, split) of the low-resource figure's runs: its `system` pattern formatted
    for each model, size N and sample K, in that order."""
    spec = config["report"]["low_resource"]
    if not spec:
        return []
    return [(spec["dataset"], spec["system"].format(model=m, size=n, split=k), spec["split"])
            for m in spec["models"] for n in spec["sizes"] for k in range(spec["splits"])]


def report_stage_mistakes(config: dict[str, Any]) -> list[str]:
    """The report's stage suffixes, significance baselines, t-SNE stage and low-resource systems
    must name runs the rules build: else the dry run stops at a missing run that names no key,
    or (a stage past `rounds`) trains mining rounds nothing asked for."""
    report, rounds = config["report"], _rounds(config)
    uses: list[tuple[str, str, str]] = []  # (key, stage, dataset)
    datasets: list[tuple[str, str]] = []  # (key, dataset) our models have runs on
    messages = []
    for table in report["tables"]:
        columns = [(f"report.tables[{table['name']}].columns.{i}.dataset", c["dataset"])
                   for i, c in enumerate(table["columns"])]
        stages = []  # (key, stage) of this table's dense systems
        for key, system, stage in table_systems(config, table):
            if stage is None:
                messages.append(_unknown_system(config, key, system))
            elif stage:
                stages.append((key, stage))
        if stages:
            datasets += columns
            uses += [(key, stage, d) for key, stage in stages for _, d in columns]
    tsne = report["analysis"]["tsne"]
    if tsne:
        datasets.append(("report.analysis.tsne.dataset", tsne["dataset"]))
        uses.append(("report.analysis.tsne.stage", tsne["stage"], tsne["dataset"]))
    if report["low_resource"]:
        datasets.append(("report.low_resource.dataset", report["low_resource"]["dataset"]))
    messages += _low_resource_mistakes(config, uses)
    messages += [m for key, d in datasets if (m := _dense_dataset_mistake(key, d, rounds))]
    messages += [m for key, stage, d in uses
                 if d in rounds and (m := _stage_mistake(key, stage, d, rounds))]
    return messages


def _system_stage(config: dict[str, Any], system: str) -> str | None:
    """A significance baseline's fixed `system`: "" for bm25 or a baseline encoder, the stage of
    one of our <model>-<stage> systems, None for a name nothing builds."""
    if system == "bm25" or system in _names(config["evaluate"].get("baselines")):
        return ""
    # The longest model name first: `costa-abl-stage1` is costa-abl's stage1, not costa's.
    for model in sorted(_names(config["pretrain"]["models"]), key=len, reverse=True):
        if system.startswith(f"{model}-"):
            return system.removeprefix(f"{model}-")
    return None


def _unknown_system(config: dict[str, Any], key: str, system: str) -> str:
    fixed = _names(config["evaluate"].get("baselines"))
    return (f"config key '{key}': '{system}' is no system the workflow builds: bm25, an "
            f"evaluate.baselines name ({', '.join(fixed) or 'none'}) or <model>-<stage> of a "
            "pretrain.models entry")


def _low_resource_mistakes(config: dict[str, Any], uses: list) -> list[str]:
    """The low-resource figure's `system` pattern must name, for each size N and split K, that
    sample's own run (<model>-nNsK-stage<k>); the stage of each system it reads joins `uses`."""
    spec = config["report"]["low_resource"]
    if not spec:
        return []
    key = "report.low_resource.system"
    try:
        cells = low_resource_systems(config)
    # {model.x} raises AttributeError, {model[x]} TypeError: refused alike
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as error:
        return [f"config key '{key}': '{spec['system']}' does not format with "
                f"{{model}}, {{size}} and {{split}} ({error!r})"]
    samples = [(m, n, k) for m in spec["models"] for n in spec["sizes"]
               for k in range(spec["splits"])]  # low_resource_systems' order
    stages: dict[str, str] = {}  # what follows n<N>s<K>-: its first sample's stage
    for (model, size, split), (_, system, _) in zip(samples, cells):
        stage = system.removeprefix(f"{model}-")
        if not stage.startswith(f"n{size}s{split}-"):
            return [f"config key '{key}': '{spec['system']}' gives '{system}' for model "
                    f"{model}, size {size}, split {split}; write "
                    "'{model}-n{size}s{split}-stage<k>', each sample's own runs"]
        stages.setdefault(stage.removeprefix(f"n{size}s{split}-"), stage)
    uses += [(key, stage, spec["dataset"]) for stage in stages.values()]
    return []
