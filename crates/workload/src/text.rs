//! Deterministic prompt text: the same segment id always renders to the same words, one word per
//! token, in every process and release.
//!
//! Token `i` of segment `id` is the word `VOCABULARY[xxh3(id, i) % 256]` (xxh3-64 over the
//! little-endian bytes of `id` then `i`, seed [`TEXT_SEED`]). Words are lowercase ASCII and are
//! joined by single spaces, so a mock engine can tokenize by splitting on whitespace (one word,
//! one token) and every character is one byte. The vocabulary and the seed are part of the
//! public contract: changing either changes every rendered prompt and every routing key derived
//! from it, so the golden test below pins them.
//!
//! Literal text (ShareGPT conversations, `"content"` messages of our JSONL traces) is turned into
//! a [`Segment`] by [`text_segment`]: its tokens ([`tokens`]: whitespace-separated words, each
//! CJK character on its own, long runs without spaces in pieces) are counted and its id is
//! chained from the previous segment, the role and the tokens, so equal histories give equal ids.
//! [`text_segments`] does the same in chunks of a fixed number of words, so prompts that share
//! only their opening words still share segments.

use crate::ids::CONTENT_ID_TAG;
use crate::request::{Role, Segment};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the word choice. Part of the rendering contract: never change it.
pub const TEXT_SEED: u64 = 0x7072_6566_6978_7274; // "prefixrt"

/// Seed of the content-derived segment ids of [`text_segment`]. Part of the contract.
pub const CONTENT_SEED: u64 = 0x636f_6e74_656e_7431; // "content1"

/// The fixed word list: 256 short lowercase English words (a power of two so the choice is a
/// mask). Part of the rendering contract: never reorder or edit it.
pub const VOCABULARY: [&str; 256] = [
    "able", "acid", "aged", "also", "area", "army", "away", "baby", "back", "ball", "band", "bank",
    "base", "bath", "bear", "beat", "been", "beer", "bell", "belt", "best", "bill", "bird", "blow",
    "blue", "boat", "body", "bomb", "bond", "bone", "book", "boom", "born", "boss", "both", "bowl",
    "bulk", "burn", "bush", "busy", "call", "calm", "came", "camp", "card", "care", "case", "cash",
    "cast", "cell", "chat", "chip", "city", "club", "coal", "coat", "code", "cold", "come", "cook",
    "cool", "cope", "copy", "core", "cost", "crew", "crop", "dark", "data", "date", "dawn", "days",
    "dead", "deal", "dean", "dear", "debt", "deep", "deny", "desk", "dial", "diet", "disc", "disk",
    "does", "done", "door", "dose", "down", "draw", "drew", "drop", "drug", "dual", "duke", "dust",
    "duty", "each", "earn", "ease", "east", "easy", "edge", "else", "even", "ever", "exit", "face",
    "fact", "fail", "fair", "fall", "farm", "fast", "fate", "fear", "feed", "feel", "feet", "fell",
    "felt", "file", "fill", "film", "find", "fine", "fire", "firm", "fish", "five", "flat", "flow",
    "food", "foot", "ford", "form", "fort", "four", "free", "from", "fuel", "full", "fund", "gain",
    "game", "gate", "gave", "gear", "gene", "gift", "girl", "give", "glad", "goal", "goes", "gold",
    "golf", "gone", "good", "gray", "grew", "grey", "grow", "gulf", "hair", "half", "hall", "hand",
    "hang", "hard", "harm", "hate", "have", "head", "hear", "heat", "held", "hell", "help", "here",
    "hero", "high", "hill", "hire", "hold", "hole", "holy", "home", "hope", "host", "hour", "huge",
    "hung", "hunt", "hurt", "idea", "inch", "into", "iron", "item", "jack", "jane", "jean", "john",
    "join", "jump", "jury", "just", "keen", "keep", "kent", "kept", "kick", "kill", "kind", "king",
    "knee", "knew", "know", "lack", "lady", "laid", "lake", "land", "lane", "last", "late", "lead",
    "left", "less", "life", "lift", "like", "line", "link", "list", "live", "load", "loan", "lock",
    "long", "look", "lord", "lose", "loss", "lost", "love", "luck", "made", "mail", "main", "make",
    "male", "many", "mark", "mass",
];

/// The word of token `index` of segment `id`.
#[inline]
pub fn word(id: u64, index: u32) -> &'static str {
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&id.to_le_bytes());
    bytes[8..].copy_from_slice(&index.to_le_bytes());
    let h = xxh3_64_with_seed(&bytes, TEXT_SEED);
    VOCABULARY[(h & 0xff) as usize]
}

/// Appends the first `tokens` words of segment `id` to `out`, separated by single spaces (no
/// leading or trailing space).
pub fn render_segment(id: u64, tokens: u32, out: &mut String) {
    for i in 0..tokens {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word(id, i));
    }
}

/// Like [`render_segment`] but appends at most `max_chars` characters (cutting the last word if
/// needed) and returns how many it appended. Costs O(`max_chars`), not O(`tokens`), so a routing
/// key can be derived from an 8,000-token document cheaply.
pub fn render_segment_bounded(id: u64, tokens: u32, out: &mut String, max_chars: usize) -> usize {
    let mut written = 0usize;
    for i in 0..tokens {
        if written >= max_chars {
            break;
        }
        if i > 0 {
            out.push(' ');
            written += 1;
            if written >= max_chars {
                break;
            }
        }
        let w = word(id, i);
        let take = w.len().min(max_chars - written);
        // Words are ASCII, so any byte index is a character boundary.
        out.push_str(&w[..take]);
        written += take;
    }
    written
}

/// Number of characters [`render_segment`] appends for `tokens` words of segment `id`.
pub fn rendered_len(id: u64, tokens: u32) -> usize {
    let words: usize = (0..tokens).map(|i| word(id, i).len()).sum();
    words + (tokens as usize).saturating_sub(1)
}

/// Characters a token in a run without spaces longer than [`LONG_RUN`] (base64, URLs, hashes),
/// about what BPE tokenizers give such text.
const CHARS_PER_TOKEN: usize = 4;

/// Longest run of characters without spaces read as one token (a long English word is still one
/// or two).
const LONG_RUN: usize = 16;

/// Whether `c` is a CJK ideograph, kana, Hangul syllable or CJK punctuation (or full-width form):
/// text in these scripts has no spaces between words, and tokenizers give about one token a
/// character.
fn is_cjk(c: char) -> bool {
    matches!(
        u32::from(c),
        0x3000..=0x30FF
            | 0x3400..=0x4DBF
            | 0x4E00..=0x9FFF
            | 0xAC00..=0xD7AF
            | 0xF900..=0xFAFF
            | 0xFF00..=0xFFEF
            | 0x20000..=0x2FFFF
    )
}

/// The tokens of literal text as this crate counts them: whitespace-separated words, where a
/// CJK character is a token of its own and a run of other characters longer than [`LONG_RUN`]
/// is cut into pieces of [`CHARS_PER_TOKEN`]. One word one token alone read 3,000 characters of
/// Chinese as 1 token (and nothing shared between prompts that shared all of them but the end).
pub fn tokens(text: &str) -> Tokens<'_> {
    Tokens {
        words: text.split_whitespace(),
        rest: "",
        long: false,
    }
}

/// See [`tokens`].
#[derive(Debug, Clone)]
pub struct Tokens<'a> {
    words: std::str::SplitWhitespace<'a>,
    /// What is left of the current word.
    rest: &'a str,
    /// The run being cut is longer than [`LONG_RUN`]: it goes in pieces to its end.
    long: bool,
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.rest.is_empty() {
            self.rest = self.words.next()?;
            self.long = false;
        }
        let rest = self.rest;
        let mut chars = rest.char_indices();
        let (_, first) = chars.next()?;
        let take = if is_cjk(first) {
            self.long = false;
            first.len_utf8()
        } else {
            // The run of other characters, up to the next CJK one.
            let end = rest
                .char_indices()
                .find(|&(_, c)| is_cjk(c))
                .map_or(rest.len(), |(i, _)| i);
            if !self.long && rest[..end].chars().count() > LONG_RUN {
                self.long = true;
            }
            if self.long {
                let cut = rest[..end]
                    .char_indices()
                    .nth(CHARS_PER_TOKEN)
                    .map_or(end, |(i, _)| i);
                if cut == end {
                    self.long = false;
                }
                cut
            } else {
                end
            }
        };
        let (token, rest) = rest.split_at(take);
        self.rest = rest;
        Some(token)
    }
}

/// Turns literal text into a segment: one token per [`tokens`] item, with an id chained
/// from `parent` (the previous segment's id in the prompt, or 0 at the start), the role and the
/// words, so equal histories give equal ids. Returns `None` for text without words.
///
/// The id lives in the content id space ([`CONTENT_ID_TAG`]) so it never equals a generator or
/// Mooncake id. Rendering the segment gives vocabulary words, not the original text: the token
/// count and the sharing structure are kept, the wording is not.
pub fn text_segment(parent: u64, role: Role, text: &str) -> Option<Segment> {
    let mut words = 0u32;
    let mut h = xxh3_64_with_seed(&parent.to_le_bytes(), CONTENT_SEED ^ role_tag(role));
    for w in tokens(text) {
        words = words.saturating_add(1);
        // Chain word by word so "a b" and "ab" differ; the whitespace between words is
        // normalized, as one-word-one-token tokenization implies.
        h = xxh3_64_with_seed(w.as_bytes(), h);
    }
    (words > 0).then_some(Segment {
        id: CONTENT_ID_TAG | (h >> 2),
        tokens: words,
    })
}

/// Turns literal text into segments of at most `chunk_words` words each (0: no limit, one
/// segment as [`text_segment`] gives), appended to `out`. Each chunk's id is chained from the
/// previous one's (the first from `parent`) exactly as [`text_segment`] chains, so a chunk equals
/// `text_segment(p, role, chunk_text)` where `p` is the id before it, and prompts whose words
/// agree up to a chunk boundary share every segment up to it. Returns the last id appended, or
/// `parent` when the text has no words.
pub fn text_segments(
    parent: u64,
    role: Role,
    text: &str,
    chunk_words: usize,
    out: &mut Vec<Segment>,
) -> u64 {
    chunk_segments(parent, role, tokens(text), chunk_words, out)
}

/// [`text_segments`] over words already split (text parts of one message run on as one text).
pub(crate) fn chunk_segments<'a>(
    parent: u64,
    role: Role,
    words: impl Iterator<Item = &'a str>,
    chunk_words: usize,
    out: &mut Vec<Segment>,
) -> u64 {
    let limit = if chunk_words == 0 {
        usize::MAX
    } else {
        chunk_words
    };
    let start =
        |parent: u64| xxh3_64_with_seed(&parent.to_le_bytes(), CONTENT_SEED ^ role_tag(role));
    let mut last = parent;
    let mut h = start(last);
    let mut in_chunk = 0usize;
    for w in words {
        // The same word-by-word chain as text_segment, restarted from each chunk's id.
        h = xxh3_64_with_seed(w.as_bytes(), h);
        in_chunk += 1;
        if in_chunk == limit {
            last = push_chunk(h, in_chunk, out);
            h = start(last);
            in_chunk = 0;
        }
    }
    if in_chunk > 0 {
        last = push_chunk(h, in_chunk, out);
    }
    last
}

fn push_chunk(h: u64, words: usize, out: &mut Vec<Segment>) -> u64 {
    let id = CONTENT_ID_TAG | (h >> 2);
    out.push(Segment {
        id,
        tokens: u32::try_from(words).unwrap_or(u32::MAX),
    });
    id
}

fn role_tag(role: Role) -> u64 {
    match role {
        Role::System => 1,
        Role::User => 2,
        Role::Assistant => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn golden_first_words() {
        // Pins the vocabulary, the seed and the hash input layout: if this changes, every
        // rendered prompt and routing key changes with it.
        let mut s = String::new();
        render_segment(42, 8, &mut s);
        assert_eq!(s, GOLDEN_42);
    }

    const GOLDEN_42: &str = "dead flat from king held kill bulk jack";

    #[test]
    fn text_without_spaces_is_counted_as_tokenizers_count_it() {
        fn t(text: &str) -> Vec<&str> {
            tokens(text).collect()
        }
        assert_eq!(t("a few  words\n here"), ["a", "few", "words", "here"]);
        assert_eq!(t("hello,世界abc"), ["hello,", "世", "界", "abc"]);
        // A long run without spaces: pieces of 4 characters to its end.
        assert_eq!(
            t("aGVsbG8gd29ybGQgYmFzZTY0IQ== ok"),
            ["aGVs", "bG8g", "d29y", "bGQg", "YmFz", "ZTY0", "IQ==", "ok"]
        );
        assert_eq!(t("internationalization").len(), 5);
        let chinese = "系统提示".repeat(750);
        let seg = text_segment(0, Role::System, &chinese).map(|s| s.tokens);
        assert_eq!(seg, Some(3_000));
        // Two prompts sharing all but their last characters share their chunks up to there.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        text_segments(0, Role::User, &format!("{chinese}甲"), 512, &mut a);
        text_segments(0, Role::User, &format!("{chinese}乙"), 512, &mut b);
        assert_eq!(a.len(), 6);
        assert_eq!(a[..5], b[..5]);
        assert_ne!(a[5], b[5]);
    }

    #[test]
    fn vocabulary_is_lowercase_ascii_words_without_duplicates() {
        let mut seen = std::collections::HashSet::new();
        for w in VOCABULARY {
            assert!(
                !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()),
                "{w}"
            );
            assert!(seen.insert(w), "duplicate {w}");
        }
    }

    #[test]
    fn zero_tokens_render_nothing() {
        let mut s = String::new();
        render_segment(1, 0, &mut s);
        assert!(s.is_empty());
        assert_eq!(rendered_len(1, 0), 0);
    }

    #[test]
    fn text_segment_counts_words_and_chains() {
        let a = text_segment(0, Role::User, "hello  big\nworld").unwrap();
        assert_eq!(a.tokens, 3);
        assert_eq!(a, text_segment(0, Role::User, "hello big world").unwrap());
        assert_ne!(
            a.id,
            text_segment(1, Role::User, "hello big world").unwrap().id
        );
        assert_ne!(
            a.id,
            text_segment(0, Role::Assistant, "hello big world")
                .unwrap()
                .id
        );
        assert_ne!(
            a.id,
            text_segment(0, Role::User, "hellobig world").unwrap().id
        );
        assert_eq!(a.id >> 62, 0b10);
        assert!(text_segment(0, Role::User, "  \n").is_none());
    }

    #[test]
    fn text_segments_chunks_chain_like_text_segment() {
        let text = "a b c d e f g";
        let mut out = Vec::new();
        let last = text_segments(9, Role::User, text, 3, &mut out);
        assert_eq!(
            out.iter().map(|s| s.tokens).collect::<Vec<_>>(),
            vec![3, 3, 1]
        );
        assert_eq!(out[0], text_segment(9, Role::User, "a b c").unwrap());
        assert_eq!(
            out[1],
            text_segment(out[0].id, Role::User, "d e f").unwrap()
        );
        assert_eq!(out[2], text_segment(out[1].id, Role::User, "g").unwrap());
        assert_eq!(last, out[2].id);
        let mut whole = Vec::new();
        text_segments(9, Role::User, text, 0, &mut whole);
        assert_eq!(whole, vec![text_segment(9, Role::User, text).unwrap()]);
        let mut none = Vec::new();
        assert_eq!(text_segments(9, Role::User, " \n ", 3, &mut none), 9);
        assert!(none.is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn one_word_per_token(id in any::<u64>(), tokens in 0u32..300) {
            let mut s = String::new();
            render_segment(id, tokens, &mut s);
            prop_assert_eq!(s.split_whitespace().count(), tokens as usize);
            prop_assert_eq!(s.len(), rendered_len(id, tokens));
            prop_assert!(!s.contains("  "));
        }

        #[test]
        fn bounded_is_a_prefix_of_full(id in any::<u64>(), tokens in 0u32..200, max in 0usize..1500) {
            let mut full = String::new();
            render_segment(id, tokens, &mut full);
            let mut cut = String::new();
            let n = render_segment_bounded(id, tokens, &mut cut, max);
            prop_assert_eq!(n, cut.len());
            prop_assert_eq!(cut.len(), full.len().min(max));
            prop_assert!(full.starts_with(&cut));
        }
    }
}
