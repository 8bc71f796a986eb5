"""Everything that runs PyTorch, each process speaking one JSON object a line each way (conversation):
- benchsuite's PyTorch rows (peers: scripts/torch-peers), a case per stage (cases/, on case's base class) reading
  the inputs benchsuite drew (inputs);
- autotune's PyTorch worker (worker: scripts/torch-step --serve), which runs the twin of the training step (step)
  or the user's own model (entry, with CUDA graphs in entry_graphs), within a host-memory limit (memory).
torch is imported by the modules that need it, never by this package itself."""
