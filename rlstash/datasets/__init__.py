"""Offline datasets in and out of rlstash's replay: Minari (:mod:`rlstash.datasets.minari`,
``pip install 'rlstash[minari]'``; the minari package is imported only when used)."""
