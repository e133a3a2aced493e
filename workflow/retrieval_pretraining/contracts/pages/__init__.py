"""The page contract: the results tables (results/tables.md with its provenance section,
results/report/tables.{html,json}; tables.py), the other HTML and Markdown pages (the stage
statistics, the analyses' pages, the span sample) and the Snakemake report.
"""
