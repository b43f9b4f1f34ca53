from serving import serve_stack  # noqa: F401  (the session's shared Ray Serve stack)
