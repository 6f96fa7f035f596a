"""Command-line entry points: thin `@hydra.main` wrappers (`train`, `eval`, `translate`, `compare`) and the
Hydra application they share (`app`: where the configs live, resolvers, the run-directory check)."""
