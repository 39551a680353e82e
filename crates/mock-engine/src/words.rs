//! Deterministic generated text: the same prompt always gets the same answer.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Words the mock engine answers with (one word is one token).
const WORDS: [&str; 32] = [
    "the", "model", "cache", "prefix", "token", "block", "engine", "router", "fast", "slow",
    "warm", "cold", "queue", "batch", "step", "decode", "prefill", "reuse", "hit", "miss",
    "answer", "request", "stream", "chunk", "share", "route", "load", "keep", "send", "wait",
    "done", "again",
];

/// Word `index` of the answer to a prompt whose digest is `seed`.
pub(crate) fn word(seed: u64, index: u32) -> &'static str {
    let h = xxh3_64_with_seed(&index.to_le_bytes(), seed);
    WORDS[(h % WORDS.len() as u64) as usize]
}

/// Appends words `from..to` of the answer, each but the answer's first preceded by a space,
/// so concatenated deltas equal the whole text.
pub(crate) fn push_words(seed: u64, from: u32, to: u32, out: &mut String) {
    for i in from..to {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word(seed, i));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_concatenate_to_the_whole_answer() {
        let mut whole = String::new();
        push_words(7, 0, 10, &mut whole);
        let mut parts = String::new();
        push_words(7, 0, 3, &mut parts);
        push_words(7, 3, 10, &mut parts);
        assert_eq!(whole, parts);
        assert_eq!(whole.split(' ').count(), 10);
    }
}
