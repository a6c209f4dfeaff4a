"""The rule language: model, loader, JSON Schema, compiled matchers and actions (issue 4)."""
