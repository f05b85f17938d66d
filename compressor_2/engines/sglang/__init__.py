"""The SGLang engine (`engine.SGLangEngine`) and what it stands on: the server a run launches, the two request paths, the server's facts, the served model and the steering probe."""
