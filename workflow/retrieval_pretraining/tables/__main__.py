"""Results tables (results/tables.md) from the per-query metrics of every configured system.

    python -m retrieval_pretraining.tables --config '<report slice JSON>' --results results \
        --out results/tables.md [--json J] [--html H] [--figure F] [--allow-missing]
    python -m retrieval_pretraining.tables --config '<report slice JSON>' --results results \
        --low-resource-only --out results/analysis/low-resource.md [--figure F] [--allow-missing]
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

from ..config import ConfigError, closed, refuse_unknown, section_schema, stage_parser
from ..errors import command
from .make import make_low_resource, make_tables

log = logging.getLogger(__name__)


# What rules/report.smk `report_params` passes.
SLICE_KEYS = ("experiment", "resolved_config", "report", "models", "losses", "encoders",
              "dense_shards", "bm25", "bm25_by_dataset", "bm25_index_copies", "trained_on",
              "baselines", "declared")


def check_config(params: dict) -> None:
    """Refuse an unknown key (in `report` and `models` too) and a slice without `report`."""
    models = copy.deepcopy(section_schema("pretrain")["properties"]["models"])
    # report_models adds what the tables place published numbers by (corpora.pretraining_datasets,
    # paper_numbers.pretraining_base).
    models["items"]["properties"]["pretrained_on"] = {"type": "array", "items": {"type": "string"}}
    models["items"]["properties"]["base"] = {"type": "string"}
    schema = closed(SLICE_KEYS, report=section_schema("report"), models=models)
    refuse_unknown(params, schema, "tables")
    if "report" not in params:
        raise ConfigError("tables: the config has no 'report' block; pass the slice "
                          "rules/report.smk builds (report_params)")


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.prog = "python -m retrieval_pretraining.tables"  # not "__main__.py"
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--out", type=Path, default=Path("results/tables.md"))
    parser.add_argument(
        "--json", type=Path, default=None, help="machine-readable copy of the tables"
    )
    parser.add_argument(
        "--html", type=Path, default=None, help="the tables as HTML (Snakemake report)"
    )
    parser.add_argument(
        "--figure", type=Path, default=None, help="the low-resource PNG (if configured)"
    )
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="render a missing metrics file as – instead of failing (partial tables)",
    )
    parser.add_argument(
        "--low-resource-only",
        action="store_true",
        help="write the low-resource section (and --figure) alone, from its runs' metrics alone",
    )
    args = parser.parse_args(argv)
    if args.low_resource_only and (args.json or args.html):
        # That section alone has no JSON or HTML copy: a copy asked for would silently not be
        # written (or a stale one left in place).
        given = " and ".join(f for f, v in (("--json", args.json), ("--html", args.html)) if v)
        parser.error(f"--low-resource-only writes the low-resource section alone, with no "
                     f"JSON or HTML copy: drop {given} (or drop --low-resource-only to write "
                     "the whole tables and their copies)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    check_config(args.config)
    if args.low_resource_only:
        make_low_resource(args.config, args.results, args.out, args.figure, args.allow_missing)
        log.info("wrote %s", args.out)
        return
    make_tables(
        args.config, args.results, args.out, args.json, args.figure, args.allow_missing, args.html
    )
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
