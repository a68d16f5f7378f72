"""Judging translations and runs: BLEU/chrF (sacreBLEU) and the figures."""
