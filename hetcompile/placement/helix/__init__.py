"""Helix's shared per-request pipelines (seed 000): the comparison, never deployable.

place.py        place_shared: the node-interval MILP, its search heuristics and its bound
milp.py         the shared-pipeline MILP (Helix §4.3: intervals, flows, per-pair links)
milp_nodes.py   the exact per-node variant where node links differ
segments.py     segment search over intervals; blocks.py: block search and realization
bound.py        the flow bound and its gap
extract.py      intervals -> stage units, and their improvement
baselines.py    the Helix paper's baselines (Swarm-like, separate pipelines)
artifact.py     Helix's artifact clusters and profiles as PlacementProblems (tests, bench)

Paper: Mei et al., "Helix: Serving Large Language Models over Heterogeneous GPUs and Network via Max-Flow" (ASPLOS 2025; seed 000).
"""
