"""The deployable path: chains of one TP size, what the `place` pass lowers to vLLM replicas.

place.py    place_chains: the search (greedy seeds, local search, the chains MILP, the full-mode
            polish) and its result
search.py   ChainSearch: chains as ordered stage slots, their values, free capacity
splits.py   a chain's layer split: Helix's bottleneck split and the depth-aware one (perf's fast mode)
milp.py     the chains MILP over candidate chains (a set packing of node slots)

It reads the shared core one level up (problem, result, tables, evaluate, chain_model,
heuristics), never helix/ (a contract in pyproject.toml).
"""
