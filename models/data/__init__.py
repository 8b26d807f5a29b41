"""The factory's first stage: labelled data (pinned datasets, a user's CSV/JSONL, a transformers
folder to import), recipes as data, the vocabulary trimmed for a recipe. No torch."""
