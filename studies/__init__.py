"""The study scripts, shipped inside the package as ``kvstats.studies`` (see pyproject.toml).

Each ``<name>.py`` is a script (``python studies/<name>.py --scale quick``) that ``kvstats reproduce`` runs.
"""
