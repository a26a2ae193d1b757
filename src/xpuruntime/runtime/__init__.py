"""Runtime services: devices, workspaces, and (with a GPU) allocator, streams and the tuning cache."""
