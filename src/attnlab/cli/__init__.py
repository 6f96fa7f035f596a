"""Command-line entry points (thin `@hydra.main` wrappers)."""
