"""The absorb harness: every method on the same model and episodes, one table (compare.py: `compare`), the --tune
step (tune.py) and the report (report.py: table, plot, results files)."""
