"""Vocabulary clusters (0 = EOS/EOT, 1 = numbers and arithmetic symbols, 2.. = k-means): `builder.build_clusters`
(the build, a package reached through its face), `clusterset.ClusterSet`, `tokens.AnswerTokens`. Nothing is re-exported here: `layout` must import alone, inside an
SGLang server that has none of the other modules' dependencies."""
