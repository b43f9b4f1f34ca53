"""Ray Serve applications of the kit: target replicas, the ingress, and the app builder."""
