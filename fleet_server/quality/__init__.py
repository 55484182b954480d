"""Model quality at the fleet: shadow comparisons, drift and review-label accuracy.

:mod:`fleet_server.quality.stats` holds the statistics every quality gate and view uses
(Wilson intervals, PSI, Jensen-Shannon distance, a one-sided test of a drop in a
proportion); it is pure and imports nothing of the fleet.
"""
