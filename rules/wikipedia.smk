# Wikipedia stages: acquire the dump (download rules, run locally), extract articles to Parquet.


def get_dump_parts():
    """Names of the dump parts of this experiment (source=local: the configured files)."""
    return [part["name"] for part in config["wikipedia"]["parts"]]


def get_all_articles():
    return expand("results/wikipedia/articles/{part}.parquet", part=get_dump_parts())
