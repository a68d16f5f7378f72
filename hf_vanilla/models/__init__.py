"""The models. Each sub-package holds one model's files, the ones that travel into a Hub folder."""
