"""The reports, built from evidence files alone: a run's `report.html` (its facts, the timeline, the cost
against the cap) and the fleet's report, with their HTML pieces and dependency-free SVG charts.

Because they read only what a run left, `vast-e2e report` rebuilds any of them later; the pages load no script
and nothing from the network, so they open offline.
"""
