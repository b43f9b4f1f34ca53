"""A discrete-event cluster simulator that drives the real router and engine-scheduler code.

One file per concept: events.py (the clock and event queue), workload.py (seeded arrivals and request
sizes), profiles.py (cost and acceptance profiles, data files under profiles/), replica.py (one target
replica stepping like dspark/engine.py), routing.py (the arms: Ray's power-of-two and round robin, and the
real router/ policy), cluster.py (arrivals, routing, stats publication, failures), metrics.py (SLA
attainment, goodput, latency percentiles), __main__.py (the CLI).

What is real and what is modelled. Imported and called, never re-implemented: the engine's verify-length
policies (dspark.verify_policy, i.e. dspark.scheduler's Algorithm 1), its cost table (dspark.cost_table.
CostTable), its KV page accounting and admission (dspark.kv_cache.PageManager), its draft budget
(dspark.draft_budget.DraftBudget), and the SLA router (router.balancer.Balancer over router.policy and
router.signals, fed stats in the exact format deployments/replica_state.py publishes). Modelled: the
target forward's time (the profile's SPS table), the drafter's time, and which drafted tokens the
target accepts (sampled from per-position acceptance profiles).
"""
