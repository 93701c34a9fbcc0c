"""Writing a suite CSV of hand-made rows for the `tilesparse goals` / `plot` tests."""

import csv


def write_suite_csv(path, columns, rows):
    """``rows`` (dicts keyed by ``columns``) as a CSV at ``path``; returns ``path``."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path
