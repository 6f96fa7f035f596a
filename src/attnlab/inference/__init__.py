"""Translating with a trained model: `Translator` (lines in, lines out) and test-set evaluation."""
