"""Vocabulary clusters: 0 = EOS/EOT, 1 = numbers and arithmetic symbols, 2.. = k-means."""
