//! ShareGPT V3 JSON files (the format of vLLM's serving benchmark).
