"""Runtime services: devices, streams and events, workspaces, the on-disk tuning cache and the C++ extension.

Device memory comes from PyTorch's caching allocator (every GPU kernel here takes and returns torch tensors);
`xpuruntime.pytorch.set_allocator` sends a thread's allocations to a `torch.cuda.MemPool` of ours."""
