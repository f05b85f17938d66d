"""The logit bias the deltas become (`bias`), answer phases (`phases`), the SGLang and transformers processors and
`generate.write_processor`.
Nothing is re-exported here: `processor` and `guarded` are imported inside SGLang servers, which have none of the
other modules' dependencies."""
