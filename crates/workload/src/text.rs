//! Deterministic prompt text: the same segment id always renders to the same words, one word per
//! token, in every process and release.
