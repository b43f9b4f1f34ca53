"""SLA- and speculation-aware load balancing across target replicas.

speed.py (pure: a replica's decode rate and TPOT from its cost table, acceptance and draft budget),
policy.py (pure: predict each replica's TTFT/TPOT for a request and pick one), signals.py (pushed stats
merged with the router's own accounting), sla.py (SLA classes and how a request picks one),
balancer.py (the state between decisions), decisions.py (decisions waiting for their trace), and
serve_router.py (the Ray Serve RequestRouter that applies it all).
"""
